"""The runbook the exporter ships, served at /runbook: docs/runbook.md (installed beside this module as
runbook.md) as an HTML page whose headings carry the anchors the alerts' runbook_url ends with
(`#xpuunitengineinitfailed`, GitHub's spelling of a heading). The same page is the Prometheus console the
rules' runbook_url leads to by default (deploy/kubernetes/render.py writes it with markdown_page)."""

from __future__ import annotations

import html
import re
from importlib import resources

RUNBOOK_PATH = "/runbook"
_HEADING = re.compile(r"^(#{1,6}) (.+)$")


def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but - and _ dropped, spaces as -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def markdown_page(markdown: str, title: str) -> bytes:
    """A plain HTML rendering: headings as <hN id=anchor>, everything between them verbatim (escaped) in a
    wrapped <pre>, which keeps the runbook's tables, lists and commands as written."""
    parts: list[str] = []
    block: list[str] = []

    def flush() -> None:
        text = "\n".join(block).strip("\n")
        if text:
            parts.append(f'<pre style="white-space: pre-wrap">{html.escape(text)}</pre>')
        block.clear()

    for line in markdown.splitlines():
        heading = _HEADING.match(line)
        if heading is None:
            block.append(line)
            continue
        flush()
        level, text = len(heading.group(1)), heading.group(2).strip()
        parts.append(f'<h{level} id="{html.escape(heading_anchor(text), quote=True)}">{html.escape(text)}</h{level}>')
    flush()
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"</head>\n<body>\n{body}\n</body>\n</html>\n").encode("utf-8")


def runbook_page() -> bytes:
    """The shipped runbook as HTML."""
    markdown = resources.files("vllm_xpu_exporter.http").joinpath("runbook.md").read_text(encoding="utf-8")
    return markdown_page(markdown, "vllm-xpu-exporter runbook")
