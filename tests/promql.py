"""What the bundled rules and dashboard ask of the exporter: the metric names in PromQL expressions,
the names the metric reference (docs/metrics.md) documents, and the Prometheus/Grafana files themselves.

Prometheus 2.42 has no parse endpoint, so names come from a small tokenizer: with string literals,
label matchers, ranges, label lists, numbers and durations removed, an identifier that is neither a
keyword nor followed by "(" is a metric name. Enough for the expressions these files use; tested on
them in test_rules.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "rules" / "vllm-xpu-exporter.yaml"
DASHBOARD = REPO / "grafana" / "vllm-xpu-exporter.json"
METRICS_DOC = REPO / "docs" / "metrics.md"

KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                      "offset", "bool", "atan2", "inf", "nan",
                      # aggregation operators, which may be followed by a label list instead of "("
                      "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                      "bottomk", "topk", "quantile"})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NUMBER = re.compile(r"(?<![\w:])\d+(?:\.\d+)?(?:e[+-]?\d+)?(?:ms|[smhdwy])*(?![\w:])", re.I)
_AT = re.compile(r"@\s*(?:start\(\)|end\(\)|[\d.]+(?:e[+-]?\d+)?)", re.I)
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_QUERY_IN_TEMPLATE = re.compile(r'printf\s+"([a-zA-Z_:][a-zA-Z0-9_:]*)\{')
_NAME_MATCHER = re.compile(r'__name__\s*=~?\s*"([^"\\]*)"')
_LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?(\w+)\)$")


def metric_names(expr: str) -> set[str]:
    """Names of the series an expression selects (also those a `__name__` matcher names: `"a"`, `=~"a|b"`)."""
    names = {name for alternatives in _NAME_MATCHER.findall(expr) for name in alternatives.split("|")
             if _IDENTIFIER.fullmatch(name)}
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub(r"\1", text)
    text = _AT.sub("", text)
    text = _NUMBER.sub(" ", text)
    for match in _IDENTIFIER.finditer(text):
        token = match.group()
        if token.lower() in KEYWORDS or text[match.end():].lstrip().startswith("("):
            continue
        names.add(token)
    return names


def template_query_names(template: str) -> set[str]:
    """Names queried inside an alert's annotation template (`printf "name{...}" ... | query`)."""
    return set(_QUERY_IN_TEMPLATE.findall(template))


def documented_metrics(reference: Path = METRICS_DOC) -> set[str]:
    """The metric names of the metric reference's tables."""
    return set(re.findall(r"^\| `(xpu_[a-z0-9_]+)` \|", reference.read_text(), re.M))


def rule_groups(path: Path = RULES) -> list[dict[str, Any]]:
    return yaml.safe_load(path.read_text())["groups"]


def rules(path: Path = RULES) -> Iterator[dict[str, Any]]:
    for group in rule_groups(path):
        yield from group["rules"]


def alerting_rules(path: Path = RULES) -> list[dict[str, Any]]:
    return [rule for rule in rules(path) if "alert" in rule]


def recorded_names(path: Path = RULES) -> set[str]:
    return {rule["record"] for rule in rules(path) if "record" in rule}


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text())


def dashboard_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The panels that show data (rows left out, panels inside collapsed rows included)."""
    panels = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            panels.extend(panel.get("panels", []))
        else:
            panels.append(panel)
    return panels


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, target) of every panel target and every Prometheus annotation."""
    queries = [(f"panel {panel['title']!r} target {target['refId']}", target)
               for panel in dashboard_panels(dashboard) for target in panel["targets"]]
    queries += [(f"annotation {annotation['name']!r}", annotation)
                for annotation in dashboard["annotations"]["list"] if "expr" in annotation]
    return queries


def variable_queries(dashboard: dict[str, Any]) -> dict[str, tuple[str | None, str]]:
    """{variable: (series selector or None, label)} of the label_values() query variables."""
    found = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = _LABEL_VALUES.match(query.strip())
        if not match:
            raise ValueError(f"variable {variable['name']}: not a label_values() query: {query}")
        found[variable["name"]] = (match.group(1), match.group(2))
    return found


def dashboard_metric_names(dashboard: dict[str, Any]) -> set[str]:
    names = {name for _, target in dashboard_queries(dashboard) for name in metric_names(target["expr"])}
    for selector, _ in variable_queries(dashboard).values():
        if selector:
            names |= metric_names(selector)
    return names


def rules_metric_names(path: Path = RULES) -> set[str]:
    names = set()
    for rule in rules(path):
        names |= metric_names(rule["expr"])
        for text in rule.get("annotations", {}).values():
            names |= template_query_names(text)
    return names
