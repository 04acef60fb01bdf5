"""The gate (`python -m vllm_xpu_exporter.gate`) as a process: its stderr read as it runs, the decision it printed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from vllm_xpu_exporter.parsers import gate as gate_lines
from vllm_xpu_exporter.parsers.gate import GateDecision

GATE = [sys.executable, "-m", "vllm_xpu_exporter.gate"]


@dataclass
class GateRun:
    unit: str
    process: subprocess.Popen[bytes]
    began: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)
    ended: float | None = None

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))
        self.process.wait()
        self.ended = time.monotonic()

    def wait(self, timeout: float = 30) -> int:
        code = self.process.wait(timeout)
        self._reader.join(5)
        return code

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    @property
    def decision(self) -> GateDecision | None:
        decisions = [parsed for line in self.lines if (parsed := gate_lines.parse_line(line)) is not None]
        assert len(decisions) <= 1, self.lines
        return decisions[0] if decisions else None

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def stop(self) -> None:
        if self.running:
            self.process.kill()
        self.wait()
