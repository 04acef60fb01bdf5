"""Prometheus's query_range read for right-sizing (sources/prometheus.py): against a stand-in HTTP API that
answers each observation query, and a saved file; failures are one-line ObservedErrors. And against faulty
servers on real sockets (127.0.0.1): trickling, redirecting to another port, huge, not finite, nested too
deep, not JSON, empty: one line and exit 2 from vllm-xpu-plan, or figures bounded, never a traceback."""

from __future__ import annotations

import argparse
import json
import math
import os
import socketserver
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vllm_xpu_exporter.planner.rightsizing import parse_observed
from vllm_xpu_exporter.sources import prometheus
from vllm_xpu_exporter.sources.prometheus import QUERIES, ObservedError, queries, read_observed
from journalgen import write_journal
from rightsizedhost import CHAT, placed, run_plan, views
from sizes import MiB
from vllmlogs import journal_specs


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
        send_json(self, status, body if body is not None else {"status": "error"})

    def log_message(self, *args):
        pass


def send_json(handler: BaseHTTPRequestHandler, status: int, body: object) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


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
    (tmp_path / "deep.json").write_bytes(DEEP)
    with pytest.raises(ObservedError, match="nested too deep"):
        read_observed(args(observed=str(tmp_path / "deep.json")))


@pytest.mark.parametrize("text, message", [("[1, 2]", "not a JSON object"), ("{", "not JSON")])
def test_a_saved_file_of_no_json_object_is_refused(tmp_path, text, message):
    saved = tmp_path / "observed.json"
    saved.write_text(text)
    with pytest.raises(ObservedError, match=message):
        read_observed(args(observed=str(saved)))


class Faulty(socketserver.BaseRequestHandler):
    """A Prometheus gone wrong, on a real socket: `reply(path)` gives the bytes to send, `trickle` sends them one
    at a time that many seconds apart (status line and headers included); `sent` counts what went out."""

    reply = staticmethod(lambda path: b"")
    trickle: float = 0.0
    sent = 0
    paths: list[str] = []

    def handle(self):
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            head += chunk
        path = head.split(b" ")[1].decode()
        type(self).paths.append(path)
        data = type(self).reply(path)
        step = 1 if self.trickle else 1 << 20
        try:
            for offset in range(0, len(data), step):  # bounded: the reply's length
                self.request.sendall(data[offset:offset + step])
                type(self).sent += len(data[offset:offset + step])
                if self.trickle:
                    time.sleep(self.trickle)
        except OSError:  # the client gave up
            pass


def http_answer(body: bytes, status: str = "200 OK", headers: str = "") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{headers}"
            f"Connection: close\r\n\r\n").encode() + body


@pytest.fixture
def faulty():
    """start(reply, trickle) -> the URL of a new faulty server; `start.last` is its handler class (sent, paths)."""
    servers, handlers = [], []

    def start(reply, trickle: float = 0.0) -> str:
        handler = type("FaultyHere", (Faulty,), {"reply": staticmethod(reply), "trickle": trickle, "sent": 0,
                                                 "paths": []})
        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        handlers.append(handler)
        return f"http://127.0.0.1:{server.server_address[1]}"

    start.last = lambda: handlers[-1]
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_trickling_prometheus_is_given_up_on_at_the_one_deadline_not_read_to_its_end(faulty, monkeypatch):
    """One byte every 0.2 s keeps every read alive; the deadline is for the whole of the answers."""
    monkeypatch.setattr(prometheus, "TIMEOUT_S", 1.0)
    url = faulty(lambda path: http_answer(json.dumps(answer("u.service", 0.5)).encode()), trickle=0.2)
    with pytest.raises(ObservedError, match="no whole answer in time"):
        read_observed(args(prometheus=url))
    server = faulty.last()
    assert server.sent < len(http_answer(json.dumps(answer("u.service", 0.5)).encode())) // 2


def test_a_redirect_is_followed_within_the_origin_and_never_to_another_port(faulty):
    other = faulty(lambda path: http_answer(json.dumps(answer("u.service", 0.5)).encode()))
    elsewhere = faulty.last()
    url = faulty(lambda path: http_answer(b"", "302 Found", f"Location: {other}{path}\r\n"))
    with pytest.raises(ObservedError, match="redirected to another origin"):
        read_observed(args(prometheus=url))
    assert elsewhere.paths == []
    url = faulty(lambda path: http_answer(json.dumps(answer("u.service", 0.5)).encode()) if path.startswith("/new/")
                 else http_answer(b"", "307 Temporary Redirect", f"Location: /new{path}\r\n"))
    assert set(read_observed(args(prometheus=url))) == set(QUERIES)


def test_a_huge_answer_is_refused_without_holding_it(faulty):
    """60 MiB of a valid answer: refused at the cap, the planner's peak memory far below the answer's."""
    values = b",".join(b'[1800000000,"0.5"]' for _ in range((60 << 20) // 19))  # 60 MiB
    body = b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"unit":"u.service"},"values":[' \
        + values + b"]}]}}"
    url = faulty(lambda path: http_answer(body))
    script = ("import argparse\n"
              "from vllm_xpu_exporter.sources.prometheus import read_observed\n"
              "from vllm_xpu_exporter.sources.prometheus import ObservedError\n"
              "try:\n"
              f"    read_observed(argparse.Namespace(prometheus={url!r}, observed=None, window=86400.0, "
              "prometheus_selector=''))\n"
              "except ObservedError as error:\n"
              "    print(error)\n"
              "from memorylimit import peak_rss\n"
              "import os\n"
              "print(peak_rss(os.getpid()))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    said, peak = result.stdout.splitlines()
    assert f"is over {prometheus.MAX_ANSWER_BYTES} bytes" in said
    assert int(peak) < 160 * MiB


DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize("body, said", [
    (json.dumps(answer("vllm-xpu-chat.service", math.nan)).encode(), "not a finite number"),
    (json.dumps(answer("vllm-xpu-chat.service", math.inf)).replace("inf", "+Inf").encode(), "not a finite number"),
    (DEEP, "not a JSON answer"),
    (b"<html>Bad gateway</html>", "not a JSON answer"),
    (b"", "not a JSON answer"),
], ids=["NaN", "+Inf", "deep", "not JSON", "empty"])
def test_a_faulty_prometheus_is_one_line_and_exit_2(faulty, tmp_path, body, said):
    journal = write_journal(tmp_path / "system.journal", journal_specs(placed()))
    result = run_plan(journal, "--prometheus", faulty(lambda path: http_answer(body)))
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert len(result.stderr.splitlines()) == 1 and said in result.stderr, result.stderr


@pytest.mark.parametrize("values", [
    {"usage": 1e300, "running": 1e300, "waiting_for_capacity": 1e300, "preemptions": 1e300},
    {"usage": 0.5, "running": 0, "waiting_for_capacity": 0, "preemptions": 0.2},
], ids=["1e300", "preempting with nothing running"])
def test_figures_out_of_all_measure_are_bounded_not_a_traceback(faulty, tmp_path, values):
    journal = write_journal(tmp_path / "system.journal", journal_specs(placed()))
    names = {query: name for name, query in queries().items()}

    def reply(path: str) -> bytes:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(path).query))["query"]
        return http_answer(json.dumps(answer(CHAT, values[names[query]])).encode())

    result = run_plan(journal, "--prometheus", faulty(reply), "--format", "json")
    assert "Traceback" not in result.stderr and result.returncode == 0, result.stderr
    (chat,) = [u for d in json.loads(result.stdout)["devices"] for u in d["units"] if u["unit"] == CHAT]
    (view,) = [v for v in views() if v.unit == CHAT]
    assert chat["kv_cache_memory_bytes"] <= view.latest.max_num_seqs * view.latest.effective_required_bytes
