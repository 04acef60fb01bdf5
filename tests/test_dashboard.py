"""The bundled Grafana dashboard: importable anywhere (data source picked at import, no data source uid
written down), the variables and rows the operators need, a unit and thresholds on every panel, and
only metrics the exporter serves. That every query returns data is shown in test_alerting_e2e.py."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from promql import (README, REPO, dashboard_metric_names, dashboard_panels, dashboard_queries,
                    documented_metrics, load_dashboard, metric_names, variable_queries)

OPERATOR_DOC = REPO / "docs" / "alerts-and-dashboard.md"
ROWS = ["Device memory", "KV cache per unit", "Engine inits", "Restart headroom", "Exporter"]


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{path}[{index}]")


def rows_with_panels(dashboard: dict) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    current = None
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            current = panel["title"]
            rows[current] = list(panel.get("panels", []))
        else:
            rows[current].append(panel)
    return rows


def exprs(panel: dict) -> list[str]:
    return [target["expr"] for target in panel["targets"]]


def test_the_json_is_what_the_builder_makes():
    result = subprocess.run([sys.executable, str(REPO / "grafana" / "dashboard.py"), "--check"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_the_data_source_is_chosen_at_import_and_no_uid_is_hard_coded():
    dashboard = load_dashboard()
    assert dashboard["__inputs"] == [{"name": "DS_PROMETHEUS", "label": "Prometheus",
                                      "description": "Prometheus that scrapes vllm-xpu-exporter", "type": "datasource",
                                      "pluginId": "prometheus", "pluginName": "Prometheus"}]
    assert {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"} in dashboard["__requires"]
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    source = variables["datasource"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    assert source["current"]["value"] == "${DS_PROMETHEUS}"
    data_sources = [(path, node) for path, node in walk(dashboard) if path.endswith(".datasource")]
    assert data_sources
    for path, node in data_sources:
        assert node == {"type": "prometheus", "uid": "${datasource}"}, path
    uids = [(path, node) for path, node in walk(dashboard) if path.endswith(".uid")]
    assert [path for path, _ in uids if not path.endswith(".datasource.uid")] == [".uid"]  # the dashboard's own
    input_uses = [path for path, node in walk(dashboard) if isinstance(node, str) and "${DS_PROMETHEUS}" in node]
    assert input_uses == [".templating.list[0].current.text", ".templating.list[0].current.value"]


def test_variables_select_instance_device_and_units_from_the_exporters_metrics():
    dashboard = load_dashboard()
    queries = variable_queries(dashboard)
    assert set(queries) == {"instance", "device", "unit"}
    served = documented_metrics(README)
    for name, (selector, label) in queries.items():
        assert label == name
        assert metric_names(selector) <= served, name
    assert '$instance' in queries["device"][0] and '$instance' in queries["unit"][0]
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["unit"]["multi"] and variables["unit"]["includeAll"]


def test_rows_hold_the_panels_the_operators_need():
    dashboard = load_dashboard()
    rows = rows_with_panels(dashboard)
    assert list(rows) == ROWS
    memory = rows["Device memory"]
    stacked = next(panel for panel in memory if panel["fieldConfig"]["defaults"]["custom"].get("stacking", {})
                   .get("mode") == "normal")
    assert [metric_names(expr) for expr in exprs(stacked)] == [
        {"xpu_unit_memory_bytes"}, {"xpu_unattributed_memory_bytes"}, {"xpu_memory_total_bytes"}]
    total_override = stacked["fieldConfig"]["overrides"][0]
    assert {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}} in total_override["properties"]
    kv = " ".join(expr for panel in rows["KV cache per unit"] for expr in exprs(panel))
    for name in ("xpu_unit_kv_cache_bytes", "xpu_unit_kv_cache_required_bytes", "xpu_unit_kv_cache_max_concurrency"):
        assert name in kv
    inits = [exprs(panel) for panel in rows["Engine inits"]]
    assert [metric_names(expr) for expr in inits[0]] == [{"xpu_unit_engine_starts_total"}]
    assert any("sum by (unit, reason) (xpu_unit_engine_init_failures_total" in expr for panel in inits for expr in panel)
    assert any("xpu_unit_engine_init_overlaps_total" in expr for panel in inits for expr in panel)
    annotations = dashboard["annotations"]["list"]
    assert [annotation["name"] for annotation in annotations] == ["Engine init failures"]
    assert annotations[0]["useValueForTime"] and "xpu_unit_engine_last_failure_timestamp_seconds" in annotations[0]["expr"]
    assert all("xpu_unit_restart_headroom_bytes" in expr for panel in rows["Restart headroom"] for expr in exprs(panel))
    exporter = " ".join(expr for panel in rows["Exporter"] for expr in exprs(panel))
    assert "up{" in exporter and "xpu_exporter_collector_success" in exporter
    assert "xpu_exporter_journal_units_watched" in exporter


def test_every_panel_has_a_unit_thresholds_and_a_description():
    for panel in dashboard_panels(load_dashboard()):
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults["unit"], panel["title"]
        steps = defaults["thresholds"]["steps"]
        assert defaults["thresholds"]["mode"] == "absolute" and steps, panel["title"]
        assert steps[0]["value"] is None and all(isinstance(step["value"], (int, float)) for step in steps[1:])
        assert [step["value"] for step in steps[1:]] == sorted(step["value"] for step in steps[1:])
        assert panel["description"].strip(), panel["title"]


def test_headroom_and_kv_thresholds_match_the_alerts():
    panels = {panel["title"]: panel for panel in dashboard_panels(load_dashboard())}
    assert [step["value"] for step in panels["Restart headroom"]["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [None, 0]
    assert [step["value"] for step in panels["Max-length requests that fit"]["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [None, 1]
    assert 0.05 in [step["value"] for step in panels["Free device memory"]["fieldConfig"]["defaults"]["thresholds"]["steps"]]


def test_panels_are_filtered_by_the_variables():
    for where, target in dashboard_queries(load_dashboard()):
        expr = target["expr"]
        assert 'instance="$instance"' in expr, where
        if "xpu_unit_" in expr:
            assert 'unit=~"$unit"' in expr or 'device="$device"' in expr, where


def test_panels_fit_the_grid_without_overlapping():
    dashboard = load_dashboard()
    cells: dict[tuple[int, int], int] = {}
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps panel {cells[(x, y)]}"
                cells[(x, y)] = panel["id"]


def test_dashboard_uses_only_metrics_the_exporter_serves():
    unknown = dashboard_metric_names(load_dashboard()) - documented_metrics(README) - {"up"}
    assert unknown == set()


def test_the_operator_doc_lists_every_panel_in_its_row():
    listed = re.findall(r"^\| ([A-Z][\w ]+?) \| ([^|]+?) \| [^|]+ \|$", OPERATOR_DOC.read_text(), re.M)
    rows = rows_with_panels(load_dashboard())
    assert listed == [(row, panel["title"]) for row, panels in rows.items() for panel in panels]
