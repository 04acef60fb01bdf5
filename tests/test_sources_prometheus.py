"""Prometheus's query_range read for right-sizing (sources/prometheus.py): against a stand-in HTTP API that
answers each observation query, and a saved file; failures are one-line ObservedErrors."""

from __future__ import annotations

import argparse
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vllm_xpu_exporter.planner.rightsizing import parse_observed
from vllm_xpu_exporter.sources.prometheus import QUERIES, ObservedError, queries, read_observed


def answer(unit: str, value: float) -> dict:
    return {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"unit": unit}, "values": [[1_800_000_000, str(value)], [1_800_000_060, str(value)]]}]}}


class Api(BaseHTTPRequestHandler):
    answers: dict[str, dict] = {}
    asked: list[dict] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        url = urllib.parse.urlsplit(self.path)
        parameters = dict(urllib.parse.parse_qsl(url.query))
        type(self).asked.append(parameters)
        body = self.answers.get(parameters.get("query", ""))
        status = 200 if url.path == "/api/v1/query_range" and body is not None else 400
        data = json.dumps(body if body is not None else {"status": "error"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def api():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def args(**values) -> argparse.Namespace:
    return argparse.Namespace(**{"prometheus": None, "observed": None, "window": 86400.0, "prometheus_selector": "",
                                 **values})


def test_each_observation_is_asked_over_the_window_with_the_hosts_selector(api):
    selector = 'instance="gpu-host:10447"'
    Api.answers = {query: answer("vllm-xpu-chat.service", 0.5) for query in queries(selector).values()}
    Api.asked = []
    found = read_observed(args(prometheus=f"http://127.0.0.1:{api.server_port}/", prometheus_selector=selector))
    assert set(found) == set(QUERIES)
    assert parse_observed(found)["vllm-xpu-chat.service"][0].usage == 0.5
    assert all(selector in asked["query"] and float(asked["end"]) - float(asked["start"]) == pytest.approx(86400)
               and asked["step"] == "60" for asked in Api.asked)


def test_prometheus_refusing_a_query_is_one_error(api):
    Api.answers = {}
    with pytest.raises(ObservedError, match="HTTP 400"):
        read_observed(args(prometheus=f"http://127.0.0.1:{api.server_port}"))


def test_a_saved_file_is_read_and_a_missing_one_refused(tmp_path):
    saved = tmp_path / "observed.json"
    saved.write_text(json.dumps({name: answer("u.service", 0.1) for name in QUERIES}))
    assert set(read_observed(args(observed=str(saved)))) == set(QUERIES)
    with pytest.raises(ObservedError, match="No such file"):
        read_observed(args(observed=str(tmp_path / "missing.json")))


@pytest.mark.parametrize("text, message", [("[1, 2]", "not a JSON object"), ("{", "not JSON")])
def test_a_saved_file_of_no_json_object_is_refused(tmp_path, text, message):
    saved = tmp_path / "observed.json"
    saved.write_text(text)
    with pytest.raises(ObservedError, match=message):
        read_observed(args(observed=str(saved)))
