"""Prometheus's HTTP API, read for vllm-xpu-plan's right-sizing: `query_range` answers of the observation
queries (`vllm_xpu_exporter.rightsizing.QUERIES`), or the same answers saved in a file (`--observed`)."""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.parse
import urllib.request

from vllm_xpu_exporter.rightsizing import STEP_SECONDS, ObservedError, queries

TIMEOUT_S = 30.0
MAX_ANSWER_BYTES = 64 * 1024 * 1024


def query_range(url: str, query: str, start: float, end: float, step: int = STEP_SECONDS,
                timeout: float = TIMEOUT_S) -> object:
    """One /api/v1/query_range answer (its whole JSON); ObservedError when Prometheus cannot answer."""
    parameters = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                         "step": str(step)})
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query_range?{parameters}", timeout=timeout) as answer:
            body = answer.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as error:
        raise ObservedError(f"{url}: HTTP {error.code} for {query!r}") from None
    except (OSError, ValueError) as error:
        raise ObservedError(f"{url}: {error}") from None
    if len(body) > MAX_ANSWER_BYTES:
        raise ObservedError(f"{url}: the answer to {query!r} is over {MAX_ANSWER_BYTES} bytes: shorten --window")
    try:
        return json.loads(body)
    except json.JSONDecodeError:
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
        if not isinstance(answers, dict):
            raise ObservedError(f"{args.observed}: not a JSON object of query_range answers")
        return answers
    end = time.time()
    return {name: query_range(args.prometheus, query, end - args.window, end)
            for name, query in queries(args.prometheus_selector).items()}
