"""`vllm-xpu-exporter print NAME`: the rules, the dashboard and the systemd units, as the repository has them,
from the installed package (exporter/files/, links to rules/, grafana/ and packaging/ that the wheel carries
as files), so that a `pip install` needs no clone to set them up (docs/deployment.md)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import resources

from vllm_xpu_exporter.argparsing import EXIT_USAGE

# name on the command line -> (file in exporter/files/, where it goes)
SHIPPED = {
    "rules": ("vllm-xpu-exporter.rules.yaml", "Prometheus's rule_files (recording rules and alerts)"),
    "dashboard": ("vllm-xpu-exporter.dashboard.json", "Grafana: import it, or provision it from a file"),
    "vllm-xpu-exporter.service": ("vllm-xpu-exporter.service", "/etc/systemd/system/"),
    "vllm-xpu-exporter.default": ("vllm-xpu-exporter.default", "/etc/default/vllm-xpu-exporter (its flags)"),
    "vllm-xpu-gate.service": ("vllm-xpu-gate.service", "/etc/systemd/system/ (the init gate's service)"),
    "vllm-xpu-gate.socket": ("vllm-xpu-gate.socket", "/etc/systemd/system/ (the init gate's socket)"),
    "vllm-xpu-gate.conf": ("vllm-xpu-gate.conf", "/etc/systemd/system/UNIT.service.d/ of each gated vLLM unit"),
}


def shipped_text(name: str) -> str:
    file_name, _ = SHIPPED[name]
    return resources.files("vllm_xpu_exporter").joinpath("files", file_name).read_text(encoding="utf-8")


def usage() -> str:
    width = max(map(len, SHIPPED))
    lines = [f"  {name:<{width}}  {where}" for name, (_, where) in SHIPPED.items()]
    return ("usage: vllm-xpu-exporter print NAME\n\nprint a file the package ships, as the repository has it, "
            "to standard output:\n\n" + "\n".join(lines) + "\n\ne.g. vllm-xpu-exporter print rules > "
            "/etc/prometheus/rules/vllm-xpu-exporter.yaml\n")


def print_shipped(argv: Sequence[str]) -> int:
    if len(argv) == 1 and argv[0] in ("-h", "--help"):
        sys.stdout.write(usage())
        return 0
    if len(argv) != 1 or argv[0] not in SHIPPED:
        given = f"unknown name {argv[0]!r}" if len(argv) == 1 else "want one NAME"
        sys.stderr.write(f"vllm-xpu-exporter print: error: {given} (one of: {', '.join(SHIPPED)})\n")
        return EXIT_USAGE
    sys.stdout.write(shipped_text(argv[0]))
    return 0
