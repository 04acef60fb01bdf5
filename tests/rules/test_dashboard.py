"""The bundled Grafana dashboard: importable anywhere (data source picked at import, no data source uid
written down), the variables and rows the operators need, a unit and thresholds on every panel, and
only metrics the exporter serves. That every query returns data is shown in test_alerting_e2e.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from promql import (REPO, alerting_rules, dashboard_metric_names, dashboard_panels, dashboard_queries,
                    documented_metrics, load_dashboard, metric_names, recorded_names, variable_queries)

sys.path.insert(0, str(REPO / "rules"))
sys.path.insert(0, str(REPO / "grafana"))
import dashboard as builder  # noqa: E402  (grafana/dashboard.py and rules/render.py are scripts, not package modules)
import render  # noqa: E402

# What the default dashboard selects an exporter's series by: the rules' selector, cluster, job, instance.
EXPORTER_SCOPE = 'job="vllm-xpu-exporter",cluster=~"$cluster",job=~"$job",instance="$instance"'

OPERATOR_DOC = REPO / "docs" / "alerts-and-dashboard.md"
ROWS = ["Device memory", "Device telemetry", "KV cache per unit", "Engine inits", "Restart headroom", "Plan",
        "KV in use", "Exporter"]


def built_for(knobs: dict[str, str]) -> dict[str, Any]:
    """The dashboard grafana/dashboard.py writes for these knob overrides (the mixin's, evaluated)."""
    return json.loads(builder.render(knobs))


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
    assert list(queries) == ["cluster", "job", "instance", "device", "unit"]
    served = documented_metrics()
    for name, (selector, label) in queries.items():
        assert label == name
        assert metric_names(selector) <= served, name
    assert '$instance' in queries["device"][0] and '$instance' in queries["unit"][0]
    # each chosen within the ones before it; cluster and job offer All, which also takes series without them
    assert '$cluster' in queries["job"][0] and {'$cluster', '$job'} <= set(re.findall(r"\$\w+", queries["instance"][0]))
    # the watched units, running or not, and the containers holding the GPU (by name: issue 22), not sessions
    assert metric_names(queries["unit"][0]) == {"xpu_unit_engine_starts_total", "xpu_workload_info"}
    assert 'kind!="systemd"' in queries["unit"][0]
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["unit"]["multi"] and variables["unit"]["includeAll"]
    for name in ("cluster", "job"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*" and not variables[name]["multi"]


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
    telemetry = {panel["title"]: panel for panel in rows["Device telemetry"]}
    for title, expected, unit in [
        ("Engine busy by group", ["rate(xpu_engine_active_seconds_total"], "percentunit"),
        ("Power", ["rate(xpu_energy_joules_total"], "watt"),
        ("Temperature", ["xpu_temperature_celsius"], "celsius"),
        ("Frequency", ["xpu_frequency_hertz"], "hertz"),
        ("Throttle reasons", ["xpu_frequency_throttled"], "none"),
        ("Memory bandwidth", ["rate(xpu_memory_read_bytes_total", "rate(xpu_memory_write_bytes_total"], "Bps"),
        ("RAS errors", ["sum by (severity, category) (increase(xpu_ras_errors_total"], "short"),
        ("RAS errors since the driver loaded", ["sum by (severity) (xpu_ras_errors_total"], "short"),
        ("Memory health", ["xpu_memory_health"], "none"),
    ]:
        assert [expr.startswith(start) for expr, start in zip(exprs(telemetry[title]), expected)] == \
            [True] * len(expected), title
        assert telemetry[title]["fieldConfig"]["defaults"]["unit"] == unit, title
    by_unit = telemetry["Engine busy by unit"]
    assert [metric_names(expr) for expr in exprs(by_unit)] == [{"unit:xpu_unit_engine_busy:ratio"}]
    assert by_unit["fieldConfig"]["defaults"]["unit"] == "percentunit"
    # each engine's units stack on their own: a stack is one engine's busy share
    stacking_groups = {override["matcher"]["options"]: override["properties"][0]["value"]["group"]
                       for override in by_unit["fieldConfig"]["overrides"]}
    assert stacking_groups[" ccs$"] == "ccs" and stacking_groups[" video$"] != stacking_groups[" video-enhance$"]
    engines = telemetry["Engine busy by group"]["fieldConfig"]["defaults"]
    assert (engines["min"], engines["max"]) == (0, 1)
    assert telemetry["Throttle reasons"]["type"] == "state-timeline"
    kv = " ".join(expr for panel in rows["KV cache per unit"] for expr in exprs(panel))
    for name in ("xpu_unit_kv_cache_bytes", "xpu_unit_kv_cache_required_bytes", "xpu_unit_kv_cache_max_concurrency"):
        assert name in kv
    inits = [exprs(panel) for panel in rows["Engine inits"]]
    assert [metric_names(expr) for expr in inits[0]] == [{"xpu_unit_engine_starts_total"}]
    assert any("sum by (unit, reason) (xpu_unit_engine_init_failures_total" in expr for panel in inits for expr in panel)
    assert any("xpu_unit_engine_init_overlaps_total" in expr for panel in inits for expr in panel)
    for name in ("xpu_unit_gate_waits_total", "xpu_unit_gate_wait_seconds_total", "xpu_unit_gate_timeouts_total",
                 "xpu_unit_gate_ungated_starts_total", "xpu_unit_context_shrinks_total"):
        assert any(name in expr for panel in inits for expr in panel), name
    lengths = {panel["title"]: panel for panel in rows["KV cache per unit"]}["Maximum model length: asked for and served"]
    assert [metric_names(expr) for expr in exprs(lengths)] == [{"xpu_unit_max_model_len_requested_tokens"},
                                                               {"xpu_unit_max_model_len_tokens"}]
    annotations = dashboard["annotations"]["list"]
    assert [annotation["name"] for annotation in annotations] == ["Engine init failures"]
    assert annotations[0]["useValueForTime"] and "xpu_unit_engine_last_failure_timestamp_seconds" in annotations[0]["expr"]
    assert all("xpu_unit_restart_headroom_bytes" in expr for panel in rows["Restart headroom"] for expr in exprs(panel))
    plan = {panel["title"]: exprs(panel) for panel in rows["Plan"]}
    assert plan["Units' footprints against the GPU"] == [
        f'xpu_unit_memory_footprint_bytes{{{EXPORTER_SCOPE},device="$device"}}',
        f'xpu_memory_total_bytes{{{EXPORTER_SCOPE},device="$device"}} - 536870912']
    assert "xpu_device_units_footprint_bytes" in plan["Room left after the units' targets"][0]
    assert [metric_names(expr) for expr in plan["Planned and actual KV cache"]] == [
        {"xpu_unit_kv_cache_planned_bytes"}, {"xpu_unit_kv_cache_plan_bytes"}, {"xpu_unit_kv_cache_bytes"}]
    in_use = {panel["title"]: exprs(panel) for panel in rows["KV in use"]}
    # bytes in use (vLLM's usage joined with the unit's KV bytes) beside the KV planned and the KV allocated
    assert [metric_names(expr) for expr in in_use["KV in use, planned and allocated"]] == [
        {"unit:vllm_kv_cache_used:bytes"}, {"xpu_unit_kv_cache_planned_bytes"}, {"xpu_unit_kv_cache_bytes"}]
    assert [metric_names(expr) for expr in in_use["Preemptions and requests waiting for capacity"]] == [
        {"unit:vllm_preemptions:rate5m"}, {"unit:vllm_requests_waiting_for_capacity:sum"},
        {"unit:vllm_requests_running:sum"}]
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


# Panels coloured by an alert's threshold knob: (panel, knob, the side where the alert fires, its colour).
THRESHOLD_PANELS = [
    ("Free device memory", "memoryNearlyFullFreeRatio", "below", "red"),
    ("Unattributed memory", "unattributedMemoryRatio", "above", "orange"),
    ("Restart headroom", "restartHeadroomThresholdBytes", "below", "red"),
    ("Restart headroom now", "restartHeadroomThresholdBytes", "below", "red"),
    ("Temperature", "temperatureHighCelsius", "above", "red"),
]
# Panels whose description says when an alert fires: (panel, the knob of that alert's duration).
DURATION_PANELS = [
    ("Free device memory", "memoryNearlyFullFor"),
    ("Unattributed memory", "unattributedMemoryFor"),
    ("Restart headroom", "restartHeadroomFor"),
    ("Exporter up", "exporterDownFor"),
    ("Units watched", "noUnitsWatchedFor"),
    ("Collector success", "collectorFailingFor"),
    ("Temperature", "temperatureHighFor"),
    ("Throttle reasons", "deviceThrottledFor"),
    ("RAS errors", "deviceUncorrectableErrorsWindow"),
    ("Memory health", "memoryUnhealthyFor"),
]
# Not the defaults, and not one another.
OVERRIDES = {"memoryNearlyFullFreeRatio": "0.125", "unattributedMemoryRatio": "0.3",
             "restartHeadroomThresholdBytes": "1073741824", "memoryNearlyFullFor": "7m",
             "unattributedMemoryFor": "2h", "restartHeadroomFor": "11m", "exporterDownFor": "90s",
             "noUnitsWatchedFor": "3h", "collectorFailingFor": "13m", "temperatureHighCelsius": "87.5",
             "temperatureHighFor": "4m", "deviceThrottledFor": "17m", "deviceUncorrectableErrorsWindow": "6h",
             "memoryUnhealthyFor": "9m", "deviceThrottledReasons": "average_power|thermal",
             "temperatureSensorSelector": 'sensor=~"gpu|memory"'}
# How the panels' descriptions write the knobs' durations, ratios and temperature: for the defaults
# (mixin/config.libsonnet) and for OVERRIDES, written out rather than computed by the builder.
DEFAULT_TEXTS = {"memoryNearlyFullFor": "15 minutes", "unattributedMemoryFor": "30 minutes",
                 "restartHeadroomFor": "5 minutes", "exporterDownFor": "5 minutes", "noUnitsWatchedFor": "1 hour",
                 "collectorFailingFor": "10 minutes", "temperatureHighFor": "10 minutes",
                 "deviceThrottledFor": "10 minutes", "deviceUncorrectableErrorsWindow": "1 hour",
                 "memoryUnhealthyFor": "5 minutes", "memoryNearlyFullFreeRatio": "5 %",
                 "unattributedMemoryRatio": "10 %", "temperatureHighCelsius": "95"}
OVERRIDE_TEXTS = {"memoryNearlyFullFor": "7 minutes", "unattributedMemoryFor": "2 hours",
                  "restartHeadroomFor": "11 minutes", "exporterDownFor": "90 seconds", "noUnitsWatchedFor": "3 hours",
                  "collectorFailingFor": "13 minutes", "temperatureHighFor": "4 minutes",
                  "deviceThrottledFor": "17 minutes", "deviceUncorrectableErrorsWindow": "6 hours",
                  "memoryUnhealthyFor": "9 minutes", "memoryNearlyFullFreeRatio": "12.5 %",
                  "unattributedMemoryRatio": "30 %", "temperatureHighCelsius": "87.5"}


def colour_at(panel: dict, value: float) -> str:
    """The colour a panel's thresholds give this value."""
    colour = ""
    for step in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]:
        if step["value"] is None or step["value"] <= value:
            colour = step["color"]
    return colour


def assert_panels_follow_the_knobs(dashboard: dict, knobs: dict[str, str], texts: dict[str, str]) -> None:
    """The panels' thresholds sit at `knobs` and their descriptions say `texts` (knob: its text)."""
    panels = {panel["title"]: panel for panel in dashboard_panels(dashboard)}
    margin = 1e-6
    for title, knob, side, colour in THRESHOLD_PANELS:
        threshold = float(knobs[knob])
        below, above = threshold - margin, threshold + margin
        firing, quiet = (below, above) if side == "below" else (above, below)
        assert colour_at(panels[title], firing) == colour, (title, knob, threshold)
        assert colour_at(panels[title], quiet) != colour, (title, knob, threshold)
    for title, knob in DURATION_PANELS:
        assert texts[knob] in panels[title]["description"], (title, knob, knobs[knob], texts[knob])
    free, unattributed = panels["Free device memory"], panels["Unattributed memory"]
    assert f"below {texts['memoryNearlyFullFreeRatio']} for" in free["description"]
    assert f"above {texts['unattributedMemoryRatio']} for" in unattributed["description"]
    temperature = panels["Temperature"]["description"]
    assert f"({knobs['temperatureSensorSelector']}) stays above {texts['temperatureHighCelsius']} °C for" \
        in temperature
    assert_throttle_reasons_in_red_are_the_alerts(panels["Throttle reasons"], knobs["deviceThrottledReasons"].split("|"))


def assert_throttle_reasons_in_red_are_the_alerts(panel: dict, alerting: list[str]) -> None:
    """The state timeline colours a series ("<domain> <reason>") red when XpuDeviceThrottled fires for its reason."""
    def colour(name: str) -> str:
        mappings = panel["fieldConfig"]["defaults"]["mappings"]
        for override in panel["fieldConfig"]["overrides"]:
            if re.search(override["matcher"]["options"], name):
                mappings = next(prop["value"] for prop in override["properties"] if prop["id"] == "mappings")
        return mappings[0]["options"]["1"]["color"]
    for reason in render.THROTTLE_REASONS:
        for domain in ("gpu", "memory", "media"):
            assert colour(f"{domain} {reason}") == ("red" if reason in alerting else "orange"), (domain, reason)
    assert all(reason in panel["description"] for reason in alerting)


def test_thresholds_and_durations_match_the_alerts_knobs():
    assert_panels_follow_the_knobs(load_dashboard(), render.load_defaults(), DEFAULT_TEXTS)


def test_thresholds_and_durations_follow_overridden_knobs():
    defaults = render.load_defaults()
    assert all(defaults[knob] != value for knob, value in OVERRIDES.items())
    assert_panels_follow_the_knobs(built_for(OVERRIDES), render.knob_values(OVERRIDES), OVERRIDE_TEXTS)


def test_the_command_line_builds_a_dashboard_for_a_values_file(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text("memoryNearlyFullFreeRatio: 0.2\nexporterDownFor: 1m\n")
    result = subprocess.run([sys.executable, str(REPO / "grafana" / "dashboard.py"), "--values", str(values),
                             "--set", "exporterDownFor=3m"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == built_for({"memoryNearlyFullFreeRatio": "0.2", "exporterDownFor": "3m"})
    refused = subprocess.run([sys.executable, str(REPO / "grafana" / "dashboard.py"),
                              "--set", "memoryNearlyFullFreeRatio=5"], capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and "a ratio is a number from 0 to 1" in refused.stderr and refused.stdout == ""


def test_kv_threshold_is_the_one_the_kv_alert_compares_with():
    expr = next(rule["expr"] for rule in alerting_rules() if rule["alert"] == "XpuUnitKvCacheTooSmall")
    alert_threshold = float(re.fullmatch(r"[^<>]*<\s*([\d.]+)\s*", expr).group(1))
    panel = next(panel for panel in dashboard_panels(load_dashboard())
                 if panel["title"] == "Max-length requests that fit")
    assert colour_at(panel, alert_threshold - 1e-6) == "red" and colour_at(panel, alert_threshold) == "green"


def test_panels_are_filtered_by_the_variables():
    for where, target in dashboard_queries(load_dashboard()):
        expr = target["expr"]
        assert 'instance="$instance"' in expr, where
        if "xpu_unit_" in expr:
            assert 'unit=~"$unit"' in expr or 'device="$device"' in expr, where


def panel_expr(dashboard: dict[str, Any], title: str, values: dict[str, str]) -> str:
    """The panel's first query with the variables as given."""
    expr = next(panel for panel in dashboard_panels(dashboard) if panel["title"] == title)["targets"][0]["expr"]
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(f"${name}", values[name])
    return expr


def test_two_clusters_with_the_same_host_names_stay_apart_in_the_panels(tmp_path):
    """Two clusters whose hosts, jobs and GPUs have the same names, evaluated by promtool as Grafana asks with
    cluster a chosen (job All): the panels show a's units and a's error counts, nothing of b's."""
    dashboard = load_dashboard()
    chosen = {"cluster": "a", "job": ".*", "instance": "gpu-host:10447", "device": "0000:03:00.0"}
    series = 'instance="gpu-host:10447",job="vllm-xpu-exporter",device="0000:03:00.0"'
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f'xpu_unit_memory_bytes{{cluster="a",{series},unit="chat.service"}}', "values": "100x5"},
            {"series": f'xpu_unit_memory_bytes{{cluster="b",{series},unit="chat.service"}}', "values": "200x5"},
            {"series": f'xpu_unit_memory_bytes{{cluster="b",{series},unit="stt.service"}}', "values": "300x5"},
            {"series": f'xpu_ras_errors_total{{cluster="a",{series},severity="uncorrectable",category="reset"}}',
             "values": "1x5"},
            {"series": f'xpu_ras_errors_total{{cluster="b",{series},severity="uncorrectable",category="reset"}}',
             "values": "7x5"}],
        "promql_expr_test": [
            {"expr": panel_expr(dashboard, "Device memory by unit", chosen), "eval_time": "5m",
             "exp_samples": [{"labels": f'xpu_unit_memory_bytes{{cluster="a",{series},unit="chat.service"}}',
                              "value": 100}]},
            {"expr": panel_expr(dashboard, "RAS errors since the driver loaded", chosen), "eval_time": "5m",
             "exp_samples": [{"labels": '{severity="uncorrectable"}', "value": 1}]}],
    }]}
    (tmp_path / "panels.test.yaml").write_text(json.dumps(tests))
    result = subprocess.run(["promtool", "test", "rules", str(tmp_path / "panels.test.yaml")], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("knobs", [{}, {"selector": 'job="gpu",env="prod"', "vllmSelector": 'job="vllm-pods"',
                                        "clusterLabel": "region"}], ids=["defaults", "overridden"])
def test_every_series_a_panel_or_variable_reads_is_within_the_selector_and_the_chosen_cluster(knobs):
    """Two clusters (or two jobs) with the same host names never meet in a panel: every vector selector of
    every query carries the rules' selector (vLLM's recorded series: vllmSelector) and the cluster variable
    on the clusterLabel knob; the exporter's series the job variable too. Variables choose in that order."""
    values = render.knob_values(knobs)
    dashboard = built_for(knobs)
    cluster = f'{values["clusterLabel"]}=~"$cluster"'
    queries = [(where, target["expr"]) for where, target in dashboard_queries(dashboard)]
    queries += [(f"variable {name}", selector) for name, (selector, _) in variable_queries(dashboard).items()
                if name != "cluster"]
    for where, expr in queries:
        selectors = re.findall(r"\{([^{}]*)\}", re.sub(r"\{\{[^}]*\}\}", "", expr))
        assert selectors, where
        for selector in selectors:
            if "unit:vllm_" in expr:
                assert selector.startswith(f'{values["vllmSelector"]},{cluster},instance="$instance"'), (where, selector)
            else:
                assert selector.startswith(f'{values["selector"]},{cluster}') or \
                    selector.startswith('__name__=~') and f'{values["selector"]},{cluster}' in selector, (where, selector)
    (cluster_query, label) = variable_queries(dashboard)["cluster"]
    assert cluster_query == f'xpu_exporter_build_info{{{values["selector"]}}}' and label == values["clusterLabel"]


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
    unknown = dashboard_metric_names(load_dashboard()) - documented_metrics() - recorded_names() - {"up"}
    assert unknown == set()



def test_the_operator_doc_lists_every_panel_in_its_row():
    listed = re.findall(r"^\| ([A-Z][\w ]+?) \| ([^|]+?) \| [^|]+ \|$", OPERATOR_DOC.read_text(), re.M)
    rows = rows_with_panels(load_dashboard())
    assert listed == [(row, panel["title"]) for row, panels in rows.items() for panel in panels]
