"""Prometheus's HTTP API, read for vllm-xpu-plan's right-sizing: `query_range` answers of the observation
queries (`vllm_xpu_exporter.rightsizing.QUERIES`), or the same answers saved in a file (`--observed`)."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.parse

from vllm_xpu_exporter.rightsizing import STEP_SECONDS, ObservedError, queries

# One deadline for every answer of a plan together, whatever the server does (a byte every few seconds keeps
# each read alive, never the whole); the planner runs as root beside the engines.
TIMEOUT_S = 30.0
# What one answer may hold: a day at one sample a minute is about 36 KiB a unit, a week about 250 KiB. Parsed,
# an answer takes about 7 times its size; four are held at once.
MAX_ANSWER_BYTES = 8 * 1024 * 1024
MAX_REDIRECTS = 3
_CHUNK_BYTES = 64 * 1024


def _origin(url: urllib.parse.SplitResult) -> tuple[str, str, int]:
    return url.scheme, (url.hostname or "").lower(), url.port or (443 if url.scheme == "https" else 80)


def _shut(connection: http.client.HTTPConnection) -> None:
    with contextlib.suppress(OSError, AttributeError):  # closed meanwhile
        connection.sock.shutdown(socket.SHUT_RDWR)


def _read_body(url: urllib.parse.SplitResult, target: str, deadline: float) -> tuple[int, str | None, bytes]:
    """GET `target` of `url`'s origin: its status, Location and body (at most MAX_ANSWER_BYTES + 1 bytes). The
    connection is shut when `deadline` (time.monotonic) passes, whatever it is waiting for."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("timed out")
    kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    connection = kind(url.hostname, url.port, timeout=remaining)
    watchdog = threading.Timer(remaining, _shut, (connection,))
    watchdog.daemon = True
    try:
        connection.connect()
        watchdog.start()
        connection.request("GET", target, headers={"Accept": "application/json"})
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
                step: int = STEP_SECONDS) -> object:
    """One /api/v1/query_range answer (its whole JSON), all of it by `deadline` (time.monotonic);
    ObservedError when Prometheus cannot answer. Redirects are followed only within the origin of `url`
    (scheme, host and port)."""
    parameters = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                         "step": str(step)})
    asked = urllib.parse.urlsplit(f"{url.rstrip('/')}/api/v1/query_range?{parameters}")
    if asked.scheme not in ("http", "https") or not asked.hostname:
        raise ObservedError(f"{url}: not an http:// or https:// URL")
    here = asked
    try:
        for _ in range(MAX_REDIRECTS + 1):
            status, location, body = _read_body(here, urllib.parse.urlunsplit(("", "", here.path or "/", here.query,
                                                                                "")), deadline)
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
    if status != 200:
        raise ObservedError(f"{url}: HTTP {status} for {query!r}")
    if len(body) > MAX_ANSWER_BYTES:
        raise ObservedError(f"{url}: the answer to {query!r} is over {MAX_ANSWER_BYTES} bytes: shorten --window "
                            f"or narrow --prometheus-selector")
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ObservedError(f"{url}: not a JSON answer to {query!r}") from None


def read_observed(args: argparse.Namespace) -> dict[str, object]:
    """The observation answers by name: from --prometheus over --window up to now, or from --observed FILE."""
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
    return {name: query_range(args.prometheus, query, end - args.window, end, deadline=deadline)
            for name, query in queries(args.prometheus_selector).items()}
