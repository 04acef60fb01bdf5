"""Prometheus's HTTP API, read for vllm-xpu-plan's right-sizing: `query_range` answers of the observation
queries (`QUERIES`, whose answers `vllm_xpu_exporter.planner.rightsizing` reads), or the same answers saved in a file
(`--observed`). The server may ask for credentials and TLS as Prometheus's own HTTP clients give them
(`--prometheus.*`, `access`): secrets are read from files, never taken on the command line."""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import http.client
import json
import re
import socket
import ssl
import threading
import time
import urllib.parse

# One deadline for every answer of a plan together, whatever the server does (a byte every few seconds keeps
# each read alive, never the whole); the planner runs as root beside the engines.
TIMEOUT_S = 30.0
# What one answer may hold: a day at one sample a minute is about 36 KiB a unit (110 units at the cap), a week
# about 250 KiB (16). Parsed, the four answers held at once took 240 MB at the cap (2.7 GB at 60 MiB each).
MAX_ANSWER_BYTES = 4 * 1024 * 1024
MAX_REDIRECTS = 3
_CHUNK_BYTES = 64 * 1024
STEP_SECONDS = 60
# name -> PromQL over the recording rules (`{selector}`: label matchers that pick one host's series)
QUERIES = {
    "usage": "max by (unit) (unit:vllm_kv_cache_usage:ratio{{{selector}}})",
    "running": "sum by (unit) (unit:vllm_requests_running:sum{{{selector}}})",
    "waiting_for_capacity": "sum by (unit) (unit:vllm_requests_waiting_for_capacity:sum{{{selector}}})",
    "preemptions": "sum by (unit) (unit:vllm_preemptions:rate5m{{{selector}}})",
}


class ObservedError(ValueError):
    """Observations that cannot be read (one line)."""


@dataclasses.dataclass(frozen=True)
class Access:
    """What every request to the server carries (auth and tenant headers) and the TLS context of an https://
    server (None: the system's CAs)."""
    headers: tuple[tuple[str, str], ...] = ()
    tls: ssl.SSLContext | None = None


# RFC 9110's token: a header's name
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# headers that carry a secret: from the files of --prometheus.password-file / --prometheus.bearer-token-file
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
_ACCESS_FLAGS = {"prometheus_username": "--prometheus.username",
                 "prometheus_password_file": "--prometheus.password-file",
                 "prometheus_bearer_token_file": "--prometheus.bearer-token-file",
                 "prometheus_ca_file": "--prometheus.ca-file", "prometheus_headers": "--prometheus.header"}


def _has_control_character(text: str) -> bool:
    return any(ord(character) < 0x20 or ord(character) == 0x7f for character in text)


def header(value: str) -> tuple[str, str]:
    """NAME=VALUE of --prometheus.header: a header sent with every request (e.g. X-Scope-OrgID=tenant-1)."""
    name, sep, text = value.partition("=")
    name, text = name.strip(), text.strip()
    if not sep or not _HEADER_NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(f"want NAME=VALUE with NAME a header name, got {value!r}")
    if name.lower() in _SECRET_HEADERS:
        raise argparse.ArgumentTypeError(f"{name}: a secret is not taken on the command line (every user sees it in "
                                         f"ps): use --prometheus.password-file or --prometheus.bearer-token-file")
    if _has_control_character(text):
        raise argparse.ArgumentTypeError(f"{name}: a header value holds no control character")
    return name, text


def add_access_flags(group: argparse._ArgumentGroup) -> None:
    """--prometheus.username, .password-file, .bearer-token-file, .ca-file, .header (dests prometheus_username,
    prometheus_password_file, prometheus_bearer_token_file, prometheus_ca_file, prometheus_headers); check them
    with `check_access_flags`."""
    group.add_argument("--prometheus.username", dest="prometheus_username", default=None, metavar="USER",
                       help="with --prometheus: basic auth as USER, the password read from "
                            "--prometheus.password-file")
    group.add_argument("--prometheus.password-file", dest="prometheus_password_file", default=None, metavar="FILE",
                       help="the basic auth password (the file's content, surrounding white space removed)")
    group.add_argument("--prometheus.bearer-token-file", dest="prometheus_bearer_token_file", default=None,
                       metavar="FILE", help="with --prometheus: send the token in this file as "
                                            "`Authorization: Bearer` (surrounding white space removed)")
    group.add_argument("--prometheus.ca-file", dest="prometheus_ca_file", default=None, metavar="FILE",
                       help="with an https:// --prometheus: trust only the CA certificates in this PEM file "
                            "(default: the system's CAs)")
    group.add_argument("--prometheus.header", dest="prometheus_headers", type=header, action="append", default=[],
                       metavar="NAME=VALUE", help="with --prometheus: send this header with every request, e.g. a "
                                                  "tenant's X-Scope-OrgID=team-a (repeatable; no secret: "
                                                  "Authorization and Cookie are refused)")


def check_access_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    given = [flag for dest, flag in _ACCESS_FLAGS.items() if getattr(args, dest)]
    if given and args.prometheus is None:
        parser.error(f"{given[0]} goes with --prometheus")
    if (args.prometheus_username is None) != (args.prometheus_password_file is None):
        parser.error("--prometheus.username and --prometheus.password-file go together")
    if args.prometheus_username is not None and args.prometheus_bearer_token_file is not None:
        parser.error("basic auth (--prometheus.username) or a bearer token (--prometheus.bearer-token-file), not "
                     "both")
    if args.prometheus_username is not None and ":" in args.prometheus_username:
        parser.error("--prometheus.username: basic auth allows no ':' in a user name")


def _secret(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read(65536).strip()
    except OSError as error:
        raise ObservedError(f"{path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise ObservedError(f"{path}: the {what} is not UTF-8 text") from None
    if not text or _has_control_character(text):
        raise ObservedError(f"{path}: the {what} is empty or holds a control character")
    return text


def access(args: argparse.Namespace) -> Access:
    """The headers and TLS context the --prometheus.* flags ask for, their files read now (before any request):
    ObservedError naming the file that cannot be read."""
    headers = list(args.prometheus_headers)
    if args.prometheus_username is not None:
        password = _secret(args.prometheus_password_file, "password")
        credentials = base64.b64encode(f"{args.prometheus_username}:{password}".encode()).decode()
        headers.append(("Authorization", f"Basic {credentials}"))
    if args.prometheus_bearer_token_file is not None:
        headers.append(("Authorization", f"Bearer {_secret(args.prometheus_bearer_token_file, 'token')}"))
    tls = None
    if args.prometheus_ca_file is not None:
        try:
            tls = ssl.create_default_context(cafile=args.prometheus_ca_file)
        except OSError as error:  # ssl.SSLError too: no certificate in it
            raise ObservedError(f"{args.prometheus_ca_file}: not a readable PEM file of CA certificates "
                                f"({error.strerror or error})") from None
    return Access(headers=tuple(headers), tls=tls)


def queries(selector: str = "") -> dict[str, str]:
    """The PromQL of each observation, for one host's series."""
    return {name: query.format(selector=selector) for name, query in QUERIES.items()}


def _origin(url: urllib.parse.SplitResult) -> tuple[str, str, int]:
    return url.scheme, (url.hostname or "").lower(), url.port or (443 if url.scheme == "https" else 80)


def _shut(connection: http.client.HTTPConnection) -> None:
    with contextlib.suppress(OSError, AttributeError):  # closed meanwhile
        connection.sock.shutdown(socket.SHUT_RDWR)


def _read_body(url: urllib.parse.SplitResult, target: str, deadline: float,
               access: Access) -> tuple[int, str | None, bytes]:
    """GET `target` of `url`'s origin with `access`: its status, Location and body (at most MAX_ANSWER_BYTES + 1
    bytes). The connection is shut when `deadline` (time.monotonic) passes, whatever it is waiting for."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("timed out")
    if url.scheme == "https":
        connection = http.client.HTTPSConnection(url.hostname, url.port, timeout=remaining, context=access.tls)
    else:
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=remaining)
    watchdog = threading.Timer(remaining, _shut, (connection,))
    watchdog.daemon = True
    try:
        connection.connect()
        watchdog.start()
        connection.request("GET", target, headers={"Accept": "application/json", **dict(access.headers)})
        response = connection.getresponse()
        body = bytearray()
        while len(body) <= MAX_ANSWER_BYTES:
            chunk = response.read(min(_CHUNK_BYTES, MAX_ANSWER_BYTES + 1 - len(body)))
            if not chunk:
                break
            body += chunk
        if time.monotonic() >= deadline:  # the watchdog cut it short
            raise TimeoutError("timed out")
        return response.status, response.getheader("Location"), bytes(body)
    except (OSError, http.client.HTTPException):
        if time.monotonic() >= deadline:
            raise TimeoutError("timed out") from None
        raise
    finally:
        watchdog.cancel()
        connection.close()


def query_range(url: str, query: str, start: float, end: float, deadline: float,
                step: int = STEP_SECONDS, access: Access = Access()) -> object:
    """One /api/v1/query_range answer (its whole JSON), all of it by `deadline` (time.monotonic);
    ObservedError when Prometheus cannot answer. Redirects are followed only within the origin of `url`
    (scheme, host and port), so `access`'s credentials go nowhere else."""
    parameters = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                         "step": str(step)})
    asked = urllib.parse.urlsplit(f"{url.rstrip('/')}/api/v1/query_range?{parameters}")
    if asked.scheme not in ("http", "https") or not asked.hostname:
        raise ObservedError(f"{url}: not an http:// or https:// URL")
    here = asked
    try:
        for _ in range(MAX_REDIRECTS + 1):
            status, location, body = _read_body(here, urllib.parse.urlunsplit(("", "", here.path or "/", here.query,
                                                                                "")), deadline, access)
            if status not in (301, 302, 303, 307, 308) or location is None:
                break
            here = urllib.parse.urlsplit(urllib.parse.urljoin(urllib.parse.urlunsplit(here), location))
            if _origin(here) != _origin(asked):
                raise ObservedError(f"{url}: redirected to another origin ({here.scheme}://{here.netloc}): "
                                    f"not followed")
        else:
            raise ObservedError(f"{url}: more than {MAX_REDIRECTS} redirects for {query!r}")
    except TimeoutError:
        raise ObservedError(f"{url}: no whole answer in time for {query!r} (every answer within {TIMEOUT_S:g} s "
                            f"together)") from None
    except (OSError, ValueError, http.client.HTTPException) as error:
        raise ObservedError(f"{url}: {error or type(error).__name__}") from None
    if status in (401, 403):
        raise ObservedError(f"{url}: HTTP {status} for {query!r}: refused the credentials given (if any: "
                            f"--prometheus.username and --prometheus.password-file, or "
                            f"--prometheus.bearer-token-file)")
    if status != 200:
        raise ObservedError(f"{url}: HTTP {status} for {query!r}")
    if len(body) > MAX_ANSWER_BYTES:
        raise ObservedError(f"{url}: the answer to {query!r} is over {MAX_ANSWER_BYTES} bytes: shorten --window "
                            f"or narrow --prometheus-selector")
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ObservedError(f"{url}: not a JSON answer to {query!r}") from None


def read_observed(args: argparse.Namespace, access: Access = Access()) -> dict[str, object]:
    """The observation answers by name: from --prometheus over --window up to now (with `access`), or from
    --observed FILE."""
    if args.observed is not None:
        try:
            with open(args.observed, encoding="utf-8") as file:
                answers = json.load(file)
        except OSError as error:
            raise ObservedError(f"{args.observed}: {error.strerror}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ObservedError(f"{args.observed}: not JSON ({error})") from None
        except RecursionError:
            raise ObservedError(f"{args.observed}: not JSON of query_range answers (nested too deep)") from None
        if not isinstance(answers, dict):
            raise ObservedError(f"{args.observed}: not a JSON object of query_range answers")
        return answers
    end, deadline = time.time(), time.monotonic() + TIMEOUT_S
    return {name: query_range(args.prometheus, query, end - args.window, end, deadline=deadline, access=access)
            for name, query in queries(args.prometheus_selector).items()}
