"""The monitoring mixin (mixin/mixin.libsonnet) is the one source of the shipped rules and dashboard: evaluated
with its default knobs by the jsonnet package, as a jsonnet pipeline would, it writes them byte for byte; its
prometheusRules, prometheusAlerts and grafanaDashboards are what a kube-prometheus user vendors, and its knobs
(selectors, clusterLabel, showMultiCluster, runbookURLPattern) work from jsonnet alone, with two clusters'
alerts and panels kept apart. In-process (`fast`, so the floor venv's jsonnet evaluates it too) but for
promtool's checks."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import _jsonnet
import pytest
import yaml

from promql import REPO, RULES, DASHBOARD, dashboard_queries, variable_queries
from test_rules import promtool, render

MIXIN = REPO / "mixin"
TWO_CLUSTERS_TEST = REPO / "rules" / "tests" / "two-clusters.test.yaml"
# Two clusters told apart by a label of another name than the default's, as a kube-prometheus stack would.
TWO_CLUSTERS = {"clusterLabel": "k8s_cluster", "showMultiCluster": "true"}
LABEL_LIST = re.compile(r"\b(by|on)\s*\(([^)]*)\)")


def mixin(config: dict[str, str] | None = None) -> dict[str, Any]:
    """The mixin's three outputs with these knobs, evaluated as jsonnet's command line would."""
    snippet = ("local mixin = (import 'mixin.libsonnet') + { _config+:: %s };"
               " { [output]: mixin[output] for output in ['prometheusRules', 'prometheusAlerts', 'grafanaDashboards'] }"
               % json.dumps(config or {}))
    return json.loads(_jsonnet.evaluate_snippet("test", snippet, jpathdir=[str(MIXIN)]))


def strings(node: Any) -> list[str]:
    """Every string in a JSON value."""
    if isinstance(node, str):
        return [node]
    values = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    return [text for value in values for text in strings(value)]


def rules_file(outputs: dict[str, Any]) -> str:
    """The rules file a kube-prometheus pipeline writes: the recording rules' groups, then the alerts'."""
    return yaml.safe_dump({"groups": outputs["prometheusRules"]["groups"] + outputs["prometheusAlerts"]["groups"]},
                          sort_keys=False)


@pytest.mark.fast
def test_the_mixin_with_its_default_knobs_writes_the_shipped_rules_and_dashboard_byte_for_byte():
    rules = json.loads(_jsonnet.evaluate_file(str(MIXIN / "rules.jsonnet")))
    dashboard = json.loads(_jsonnet.evaluate_file(str(MIXIN / "dashboard.jsonnet")))
    assert rules == RULES.read_text()
    # JSON with two-space indentation and numbers at their shortest (as the Go evaluator writes them; the C++
    # one writes 0.05 as 0.050000000000000003)
    assert json.dumps(dashboard, indent=2) + "\n" == DASHBOARD.read_text()


@pytest.mark.fast
def test_prometheus_rules_and_alerts_are_the_shipped_groups_split_by_kind():
    outputs = mixin()
    shipped = yaml.safe_load(RULES.read_text())["groups"]
    assert outputs["prometheusRules"]["groups"] + outputs["prometheusAlerts"]["groups"] == shipped
    assert all("record" in rule for group in outputs["prometheusRules"]["groups"] for rule in group["rules"])
    assert all("alert" in rule for group in outputs["prometheusAlerts"]["groups"] for rule in group["rules"])
    assert outputs["grafanaDashboards"] == {"vllm-xpu-exporter.json": json.loads(DASHBOARD.read_text())}


@pytest.mark.fast
def test_every_placeholder_of_the_dashboard_is_a_knob_the_mixin_fills_in():
    """The mixin leaves a placeholder naming no knob as it is (Grafana's own ${datasource}); the builder's
    placeholders all name knobs, so none is left in the shipped JSON, and each knob's is."""
    knobs = set(json.loads(_jsonnet.evaluate_file(str(MIXIN / "knobs.jsonnet"))))
    placeholders = set(re.findall(r"\$\{(\w+)", (MIXIN / "dashboard.json").read_text()))
    grafana_own = {"datasource", "DS_PROMETHEUS"}
    assert placeholders - grafana_own <= knobs and placeholders - grafana_own
    assert set(re.findall(r"\$\{(\w+)", DASHBOARD.read_text())) == grafana_own


@pytest.mark.fast
def test_selectors_and_runbook_pattern_set_in_jsonnet_reach_every_rule_and_panel():
    config = {"selector": 'job="gpu"', "vllmSelector": 'job="vllm-pods"',
              "runbookURLPattern": "https://docs.example.com/xpu/runbook.html#%s"}
    outputs = mixin(config)
    text = "\n".join(strings(outputs))
    assert 'job="vllm-xpu-exporter"' not in text and 'job="vllm"' not in text
    assert 'job="gpu"' in text and 'job="vllm-pods"' in text
    for group in outputs["prometheusAlerts"]["groups"]:
        for rule in group["rules"]:
            assert rule["annotations"]["runbook_url"] == f"https://docs.example.com/xpu/runbook.html#{rule['alert'].lower()}"


def test_two_clusters_keep_their_alerts_apart_under_another_cluster_label(tmp_path):
    """Every aggregation and join of the rules keeps the configured cluster label, promtool accepts the
    kube-prometheus rules file, and the two-cluster behaviour cases pass with the label renamed."""
    outputs = mixin(TWO_CLUSTERS)
    label_lists = [(rule.get("alert") or rule["record"], labels)
                   for kind in ("prometheusRules", "prometheusAlerts") for group in outputs[kind]["groups"]
                   for rule in group["rules"] for _, labels in LABEL_LIST.findall(rule["expr"])]
    assert label_lists
    for name, labels in label_lists:
        assert "k8s_cluster" in re.split(r"\s*,\s*", labels.strip()), (name, labels)
    rules = tmp_path / "vllm-xpu-exporter.yaml"
    rules.write_text(rules_file(outputs))
    checked = promtool("check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    cases = TWO_CLUSTERS_TEST.read_text().replace("../vllm-xpu-exporter.yaml", rules.name)
    assert cases.count("{cluster=") > 10
    (tmp_path / "two-clusters.test.yaml").write_text(cases.replace("{cluster=", "{k8s_cluster=")
                                                     .replace(',cluster="', ',k8s_cluster="'))
    tested = promtool("test", "rules", str(tmp_path / "two-clusters.test.yaml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.fast
@pytest.mark.parametrize("shown", ["true", "false"])
def test_two_clusters_keep_their_panels_apart_under_another_cluster_label(shown):
    """Every query of every panel and variable below the cluster variable selects the chosen cluster on the
    configured label; showMultiCluster only hides the variable (its All shows every cluster)."""
    dashboard = mixin({**TWO_CLUSTERS, "showMultiCluster": shown})["grafanaDashboards"]["vllm-xpu-exporter.json"]
    queries = [(where, target["expr"]) for where, target in dashboard_queries(dashboard)]
    queries += [(f"variable {name}", selector) for name, (selector, _) in variable_queries(dashboard).items()
                if name not in ("cluster", "datasource")]
    assert len(queries) > 50
    for where, expr in queries:
        assert 'k8s_cluster=~"$cluster"' in expr and 'cluster=~"$cluster"' not in expr.replace("k8s_cluster", ""), \
            (where, expr)
    cluster = next(variable for variable in dashboard["templating"]["list"] if variable["name"] == "cluster")
    assert variable_queries(dashboard)["cluster"] == ('xpu_exporter_build_info{job="vllm-xpu-exporter"}', "k8s_cluster")
    assert cluster["hide"] == (0 if shown == "true" else 2)


def template_form(value: str, form: str) -> Any:
    """A knob's value in one of the templates' placeholder forms (mixin/lib/template.libsonnet)."""
    snippet = "(import 'lib/template.libsonnet').form({ knob: %s }, 'knob', %s)" % (json.dumps(value), json.dumps(form))
    return json.loads(_jsonnet.evaluate_snippet("test", snippet, jpathdir=[str(MIXIN)]))


@pytest.mark.fast
@pytest.mark.parametrize("value, form, written", [
    ("15m", "words", "15 minutes"), ("1h", "words", "1 hour"), ("90s", "words", "90 seconds"),
    ("1h30m", "words", "90 minutes"), ("2d", "words", "2 days"), ("1500ms", "words", "1.5 seconds"),
    ("1h30m", "seconds", "5400"), ("0.05", "percent", "5 %"), ("0.125", "percent", "12.5 %"),
    ("0", "bytes", "0 B"), ("536870912", "bytes", "512 MiB"), ("1073741824", "bytes", "1 GiB"),
    ("average_power|thermal", "list", "average_power, thermal"), ("87.5", "number", 87.5),
    ("0.05", "doubledRatio", 0.1), ("0.6", "doubledRatio", 1),
])
def test_knobs_are_written_in_the_form_each_placeholder_asks_for(value, form, written):
    assert template_form(value, form) == written


@pytest.mark.fast
def test_without_the_jsonnet_package_the_renderer_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "_jsonnet", None)  # import _jsonnet fails
    assert render.main(["--list"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ("render.py: the rules and dashboard are a jsonnet mixin: install "
                                                   "the Python package jsonnet (pip install jsonnet)\n")


@pytest.mark.fast
def test_a_jsonnet_pipeline_finds_every_file_the_mixin_imports_inside_its_directory():
    """jsonnet-bundler vendors the mixin/ directory alone: nothing it imports lies outside it."""
    imports = []
    for source in MIXIN.rglob("*sonnet"):
        code = "\n".join(line for line in source.read_text().splitlines() if not line.lstrip().startswith("//"))
        for target in re.findall(r"\bimport(?:str)?\s+'([^']+)'", code):
            imports.append((source, (source.parent / target).resolve()))
    assert imports
    for source, target in imports:
        assert target.is_file() and MIXIN in target.parents, (source, target)
