"""Debian's real Prometheus and Alertmanager on 127.0.0.1 for tests, and a webhook receiver.

    with Webhook() as hook, Alertmanager(tmp / "am", hook.url) as am, \\
            Prometheus(tmp / "prom", ["127.0.0.1:10447"], [rules_file], am.address) as prom:
        prom.query("up")

Each process gets its own free port (picked, then retried on a clash), its own storage directory and
its log in that directory; stop() (also on leaving the `with`) ends it, SIGKILL if SIGTERM is not
enough. Usable from a Python shell.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from polling import wait_for

PROMETHEUS = "prometheus"
ALERTMANAGER = "prometheus-alertmanager"
HOST = "127.0.0.1"
# The runbook console every shipped Prometheus serves, where the rules' runbook_url leads by default.
CONSOLES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "consoles"
START_ATTEMPTS = 5


def free_port() -> int:
    """A port free on 127.0.0.1 now (the kernel's pick); a process may still take it before we do."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def http_json(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


class _Server:
    """A binary serving HTTP on a port of its own, ready when /-/ready answers 200."""

    name = ""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log_path = self.directory / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 20) -> None:
        for _ in range(START_ATTEMPTS):
            self.port = free_port()
            log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(self.command(self.port), stdout=log, stderr=subprocess.STDOUT,
                                                cwd=self.directory, start_new_session=True)
            if wait_for(lambda: self.process.poll() is not None or self._ready(), timeout, interval=0.1) and \
                    self.process.poll() is None:
                return
            if "address already in use" not in self.log()[log_start:]:
                break
        self.stop()
        raise RuntimeError(f"{self.name} did not become ready:\n{self.log()}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 10) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Alertmanager(_Server):
    """Alertmanager routing every alert to one webhook, grouping per alert and unit, at once."""

    name = "alertmanager"

    def __init__(self, directory: Path, webhook_url: str, group_wait: str = "1s", start: bool = True) -> None:
        super().__init__(directory)
        self.config_path = self.directory / "alertmanager.yml"
        self.config_path.write_text(yaml.safe_dump({
            "route": {"receiver": "test-webhook", "group_by": ["alertname", "instance", "unit", "device"],
                      "group_wait": group_wait, "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "test-webhook",
                           "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
        }))
        if start:
            self.start()

    def command(self, port: int) -> list[str]:
        return [ALERTMANAGER, f"--config.file={self.config_path}", f"--storage.path={self.directory / 'data'}",
                f"--web.listen-address={HOST}:{port}", "--cluster.listen-address=", "--log.level=info"]

    def alerts(self) -> list[dict[str, Any]]:
        return http_json(f"{self.url}/api/v2/alerts")


class Prometheus(_Server):
    """Prometheus scraping the targets as job `job` and evaluating the rule files, serving the shipped
    consoles at its own address (its external URL)."""

    name = "prometheus"

    def __init__(self, directory: Path, targets: Sequence[str], rule_files: Sequence[Path],
                 alertmanager: str | None = None, job: str = "vllm-xpu-exporter", scrape_interval: str = "1s",
                 evaluation_interval: str = "1s", start: bool = True) -> None:
        super().__init__(directory)
        config: dict[str, Any] = {
            "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                       "evaluation_interval": evaluation_interval},
            "rule_files": [str(Path(path).resolve()) for path in rule_files],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}],
        }
        if alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
        self.config_path = self.directory / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        if start:
            self.start()

    def command(self, port: int) -> list[str]:
        return [PROMETHEUS, f"--config.file={self.config_path}", f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address={HOST}:{port}", f"--web.external-url=http://{HOST}:{port}/",
                f"--web.console.templates={CONSOLES}", "--log.level=info"]

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>?<params>; the data of a successful answer, RuntimeError otherwise."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            answer = http_json(f"{self.url}/api/v1/{path}{query}")
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"{path} {params}: {error.read().decode(errors='replace')}") from error
        if answer.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {answer}")
        return answer["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", **params)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1) -> list[dict[str, Any]]:
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=str(step))["result"]

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        params = {"match[]": match} if match else {}
        return self.api(f"label/{label}/values", **params)

    def alerts(self) -> list[dict[str, Any]]:
        return self.api("alerts")["alerts"]

    def rule_groups(self) -> list[dict[str, Any]]:
        return self.api("rules")["groups"]

    def targets_up(self) -> bool:
        active = self.api("targets")["activeTargets"]
        return bool(active) and all(target["health"] == "up" for target in active)


class Webhook:
    """An HTTP server on 127.0.0.1 that keeps every Alertmanager webhook notification it receives."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._notifications: list[dict[str, Any]] = []
        received = self._received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self.url = f"http://{HOST}:{self._server.server_address[1]}/alerts"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _received(self, notification: dict[str, Any]) -> None:
        with self._lock:
            self._notifications.append(notification)

    @property
    def notifications(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._notifications)

    def alerts(self, status: str = "firing") -> list[dict[str, Any]]:
        """Every alert of every notification with that status, in arrival order."""
        return [alert for notification in self.notifications for alert in notification["alerts"]
                if alert["status"] == status]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Webhook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
