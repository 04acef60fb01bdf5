"""vllm_xpu_exporter.parsers.services: the lines that say a watched unit runs no vLLM engine, read from what the
programs really print."""

from __future__ import annotations

import pytest

from vllm_xpu_exporter.parsers import services, vllm
from exporterproc import RunningExporter
from vllmlogs import ERA_VERSIONS, REASONS, Failure, VllmRun, engine_start_lines

NO_COLLECTORS = ["--no-collector.levelzero", "--no-collector.processes", "--no-collector.journal"]


@pytest.mark.parametrize("log_format", ["logfmt", "json"])
def test_the_exporters_start_up_line_says_it_is_no_engine_and_none_of_its_lines_is_a_vllm_line(log_format):
    with RunningExporter([*NO_COLLECTORS, "--log.format", log_format]) as exporter:
        lines = exporter.stderr.splitlines()
    recognised = [services.parse_line(line) for line in lines]
    assert services.NotAnEngine("vllm-xpu-exporter", "exporter_listening") in recognised, lines
    assert [line for line in lines if vllm.parse_line(line) is not None] == []


@pytest.mark.fast
def test_no_line_of_any_vllm_start_is_taken_for_another_service():
    runs = [VllmRun(version) for version in ERA_VERSIONS]
    runs += [VllmRun("0.24.0", failure=Failure(reason)) for reason in REASONS if reason != "other"]
    lines = [line.message for run in runs for line in engine_start_lines(run, 0.0)]
    assert lines and [line for line in lines if services.parse_line(line) is not None] == []


@pytest.mark.fast
def test_the_start_up_line_quoted_elsewhere_in_a_line_is_not_taken():
    assert services.parse_line("GET /?q=vllm-xpu-exporter 1.0 listening on http://x HTTP/1.1") is None
    assert services.parse_line("x" * services.MAX_LINE_CHARS + 'msg="vllm-xpu-exporter 1 listening on http://') is None


def test_the_gate_services_start_up_line_says_it_is_no_engine(tmp_path):
    """`vllm-xpu-gate serve`'s first line (stderr, its unit's journal), as the program prints it; the
    client's lines (`vllm-xpu-gate: ...`) are not it."""
    import subprocess
    import sys
    process = subprocess.Popen([sys.executable, "-m", "vllm_xpu_exporter.gate", "serve", "--listen",
                                str(tmp_path / "gate.sock"), "--journal.directory", str(tmp_path / "none"),
                                "--levelzero.library", "/nonexistent/libze.so"], stderr=subprocess.PIPE, text=True)
    try:
        first = process.stderr.readline().rstrip("\n")
    finally:
        process.terminate()
        process.wait(10)
    assert services.parse_line(first) == services.NotAnEngine("vllm-xpu-gate", "gate_serving"), first
    for form in ('{"ts": "2026-12-07T16:07:12.325Z", "level": "info", "source": "gate.cli", '
                 '"msg": "vllm-xpu-gate 0.3.0 serving on /run/vllm-xpu-gate/gate.sock"}',
                 "INFO vllm-xpu-gate 0.3.0 serving on /run/vllm-xpu-gate/gate.sock"):  # JSON; as 0.3.0 printed it
        assert services.parse_line(form) == services.NotAnEngine("vllm-xpu-gate", "gate_serving"), form
    assert services.parse_line("vllm-xpu-gate: released after 0.00s (waited for nothing; free 1, needed 1)") is None
