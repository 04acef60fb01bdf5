"""The exporter as a real process, started the way an operator starts it, and scraped over HTTP."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from scrapes import Samples, parse_samples

REPO = Path(__file__).resolve().parents[1]
_LISTENING = re.compile(r"listening on (https?://\S+?)(/\S*)? ")


class RunningExporter:
    def __init__(self, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 listen: str = "127.0.0.1:0", command: Sequence[str] | None = None,
                 cwd: str | os.PathLike[str] = REPO, pass_fds: Sequence[int] = ()) -> None:
        full_env = {**os.environ, **(env or {})}
        argv = list(command or [sys.executable, "-m", "vllm_xpu_exporter"]) + ["--web.listen-address", listen, *args]
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,
                                        cwd=cwd, pass_fds=pass_fds)
        self._stderr = bytearray()
        self._stderr_lock = threading.Lock()
        os.set_blocking(self.process.stderr.fileno(), False)
        self._listening = threading.Event()
        self.base_url = ""
        threading.Thread(target=self._follow_stderr, daemon=True).start()
        if not self._listening.wait(15):
            self.stop()
            raise RuntimeError(f"exporter did not start listening:\n{self.stderr}")

    def _drain_stderr(self) -> bool:
        """Move what the pipe holds into the buffer; False at end of file. Called with the lock held, by the
        follower thread and by every read of `stderr`, so that a line the exporter wrote before it answered a
        request is always there when the test reads `stderr` after the answer."""
        fd = self.process.stderr.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            self._stderr += chunk
            if not self._listening.is_set():
                match = _LISTENING.search(self._stderr.decode(errors="replace"))
                if match:
                    self.base_url = match.group(1)
                    self._listening.set()

    def _follow_stderr(self) -> None:
        poller = select.poll()
        poller.register(self.process.stderr.fileno(), select.POLLIN)
        while True:
            poller.poll()
            with self._stderr_lock:
                if not self._drain_stderr():
                    return

    @property
    def stderr(self) -> str:
        with self._stderr_lock:
            self._drain_stderr()
            return self._stderr.decode(errors="replace")

    def get(self, path: str = "/metrics", headers: Mapping[str, str] | None = None,
            timeout: float = 15) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.base_url + path, headers=dict(headers or {}))
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def scrape_text(self) -> str:
        status, _, body = self.get("/metrics")
        assert status == 200, body
        return body.decode()

    def scrape(self) -> Samples:
        """{(sample name, sorted labels): value} of one scrape."""
        return parse_samples(self.scrape_text())

    def stop(self, timeout: float = 5) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> RunningExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

