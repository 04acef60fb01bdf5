"""The bundled Prometheus rules: promtool accepts them and their unit tests pass, they follow the mixin
conventions, every alert has a runbook section and cases that fire and that do not, they ask only for
metrics the exporter serves, and operators can override their knobs.

The promtool cases check behaviour (which alerts fire, with which labels, when) apart from wording:
behaviour cases read ALERTS, which carries no annotations; rules/tests/alert-annotations.test.yaml holds
each alert's texts, which promtool compares with what Prometheus renders and the tests here check for
what they must name."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from promql import (METRICS_DOC, REPO, RULES, alerting_rules, documented_metrics, metric_names, recorded_names,
                    dashboard_metric_names, load_dashboard, rules, rules_metric_names, template_query_names)

sys.path.insert(0, str(REPO / "rules"))
import render  # noqa: E402  (rules/render.py is a script beside the rules, not a package module)

RULE_TESTS = sorted((REPO / "rules" / "tests").glob("*.test.yaml"))
WORDING_TESTS = REPO / "rules" / "tests" / "alert-annotations.test.yaml"
BEHAVIOUR_TESTS = [path for path in RULE_TESTS if path != WORDING_TESTS]
RUNBOOK = REPO / "docs" / "runbook.md"
OPERATOR_DOC = REPO / "docs" / "alerts-and-dashboard.md"
DISCOVERY_DOC = REPO / "docs" / "discovery.md"
ALERT_PREFIX = "Xpu"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, check=False)


def alert_names() -> set[str]:
    return {rule["alert"] for rule in alerting_rules()}


def github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# A behaviour check: the alerts of one name firing at eval_time, with their labels (ALERTS has no annotations).
FIRING_ALERTS = re.compile(r'ALERTS\{alertname="(\w+)",alertstate="firing"\}')
SERIES_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# Labels that say what an alert is about; its description must name their values.
IDENTIFYING_LABELS = ("instance", "unit", "device", "reason", "collector")


def rule_test_cases(path: Path) -> list[dict[str, Any]]:
    return yaml.safe_load(path.read_text())["tests"]


def firing_checks(path: Path) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """(alert name, the labels of each alert expected to fire) of a behaviour file's ALERTS checks."""
    for case in rule_test_cases(path):
        for check in case.get("promql_expr_test", []):
            if match := FIRING_ALERTS.fullmatch(check["expr"].strip()):
                yield match.group(1), [dict(SERIES_LABEL.findall(sample["labels"]))
                                       for sample in check.get("exp_samples") or []]


def wording_checks() -> Iterator[tuple[str, dict[str, str], dict[str, str]]]:
    """(alert name, labels, annotations) of every alert in the wording cases."""
    for case in rule_test_cases(WORDING_TESTS):
        for check in case["alert_rule_test"]:
            for alert in check["exp_alerts"]:
                labels = {key: str(value) for key, value in alert["exp_labels"].items()}
                yield check["alertname"], labels | {"__external_url__": case.get("external_url", "")}, \
                    alert["exp_annotations"]


def documented_failure_reasons() -> set[str]:
    listing = re.search(r"^Failure reasons: (.+?)\n\n", METRICS_DOC.read_text(), re.M | re.S)
    assert listing, "the metric reference lists no failure reasons"
    return set(re.findall(r"`(\w+)`", listing.group(1)))


def runbook_sections() -> dict[str, str]:
    """{anchor: text} of the runbook's second-level sections."""
    parts = re.split(r"^## (.+)$", RUNBOOK.read_text(), flags=re.M)
    return {github_anchor(heading): body for heading, body in zip(parts[1::2], parts[2::2])}


def test_metric_names_are_found_in_the_expressions_these_files_use():
    expr = ('(increase(a_total{x="y"}[15m]) > 0 or (b > 0.5 unless c offset 15m)) and ignoring (reason) '
            '(time() - d_seconds{job="j"} < 900)')
    assert metric_names(expr) == {"a_total", "b", "c", "d_seconds"}
    assert metric_names('sum by (unit, reason) (rate(x:y:rate5m{u=~"$unit"}[$__rate_interval])) > 0') == {"x:y:rate5m"}
    assert metric_names("absent(up{job=\"vllm-xpu-exporter\"})") == {"up"}
    assert metric_names("max by (unit) (m) / on(unit) group_left(model) info * 1000") == {"m", "info"}
    assert template_query_names('{{ with printf "xpu_a{instance=%q}" $labels.instance | query }}') == {"xpu_a"}


def test_promtool_check_rules_accepts_the_bundled_rules():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(list(rules()))} rules found" in result.stdout


def test_prometheus_pointed_at_every_rules_yaml_file_accepts_its_configuration(tmp_path):
    """An operator may list `rules/*.yaml` under rule_files: only rules files may sit at the top of rules/."""
    top_level = sorted((REPO / "rules").glob("*.yaml"))
    assert Path(RULES) in top_level
    result = promtool("check", "rules", *map(str, top_level))
    assert result.returncode == 0, result.stdout + result.stderr
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"rule_files": [str(REPO / "rules" / "*.yaml")]}))
    result = promtool("check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Checking {RULES}" in result.stdout


def test_promtool_unit_tests_of_the_rules_pass():
    assert RULE_TESTS
    result = promtool("test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_bundled_rules_are_the_template_rendered_with_the_defaults():
    assert RULES.read_text() == render.render()


def test_every_knob_has_a_default_and_is_used_by_the_rules_or_the_dashboard():
    """Every placeholder of the rules' template is a knob of mixin/config.libsonnet, and every knob is one of
    its placeholders but showMultiCluster, which only the dashboard reads."""
    rules_template = "".join(line for line in (render.MIXIN / "rules.yaml").read_text().splitlines(True)
                             if not line.startswith("#%"))  # the template's own notes
    used = set(re.findall(r"\$\{(\w+)", rules_template))
    assert used <= set(render.load_defaults())
    dashboard_only = set(render.load_defaults()) - used
    assert dashboard_only == {"showMultiCluster"}


def test_every_alert_has_behaviour_cases_that_fire_and_cases_that_do_not():
    firing, quiet = set(), set()
    for path in BEHAVIOUR_TESTS:
        for name, alerts in firing_checks(path):
            (firing if alerts else quiet).add(name)
    assert alert_names() - firing == set(), "alerts without a case where they fire"
    assert alert_names() - quiet == set(), "alerts without a case where they stay quiet"


def test_every_severity_variant_of_an_alert_is_seen_firing():
    expected = {(rule["alert"], rule["labels"]["severity"]) for rule in alerting_rules()}
    seen = set()
    for path in BEHAVIOUR_TESTS:
        for name, alerts in firing_checks(path):
            seen |= {(name, labels["severity"]) for labels in alerts}
    assert expected - seen == set()


def test_behaviour_cases_leave_the_wording_to_the_annotation_cases():
    """alert_rule_test compares annotations word for word (an omitted exp_annotations means "none"), so
    behaviour cases read ALERTS instead; the wording cases check texts only, long after any `for`."""
    assert WORDING_TESTS in RULE_TESTS and BEHAVIOUR_TESTS
    for path in BEHAVIOUR_TESTS:
        for case in rule_test_cases(path):
            assert "alert_rule_test" not in case, f"{path.name}: {case['name']}"
            for check in case.get("promql_expr_test", []):
                if "ALERTS" in check["expr"]:
                    assert FIRING_ALERTS.fullmatch(check["expr"].strip()), f"{path.name}: {check['expr']}"
    for case in rule_test_cases(WORDING_TESTS):
        assert "promql_expr_test" not in case, case["name"]
        for check in case["alert_rule_test"]:
            assert check["exp_alerts"], case["name"]
            for alert in check["exp_alerts"]:
                assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}, case["name"]


def test_every_alerting_rule_and_failure_reason_has_a_wording_case():
    checks = list(wording_checks())
    assert {(name, labels["severity"]) for name, labels, _ in checks} == \
        {(rule["alert"], rule["labels"]["severity"]) for rule in alerting_rules()}
    reasons = [labels["reason"] for name, labels, _ in checks if name == "XpuUnitEngineInitFailed"]
    assert set(reasons) == documented_failure_reasons()


def test_alert_texts_name_what_fired_and_link_to_its_runbook_section():
    sections = runbook_sections()
    pattern = render.load_defaults()["runbookURLPattern"]
    for name, labels, annotations in wording_checks():
        external_url = labels.pop("__external_url__")
        summary, description = annotations["summary"], annotations["description"]
        assert summary.endswith(".") and ". " not in summary and "\n" not in summary, (name, summary)
        for text in (summary, description):
            for leftover in ("{{", "<no value>", "%!", "${"):
                assert leftover not in text, (name, text)
        for label in IDENTIFYING_LABELS:
            if label in labels:
                assert labels[label] in description, (name, label, description)
        assert any(value in description for label, value in labels.items() if label != "severity"), name
        assert not re.search(r"\d(?:Ki|Mi|Gi|Ti|Pi)(?!B)", description), f"{name}: a byte figure without its unit"
        # Prometheus's address behind TLS: every link, XpuExporterDown's and XpuExporterAbsent's too, starts there
        assert external_url.startswith("https://"), name
        expected = pattern.replace("{{ $externalURL }}", external_url).replace("%s", name.lower())
        assert annotations["runbook_url"] == expected and name.lower() in sections, (name, annotations["runbook_url"])


def test_each_failure_reason_gets_its_own_advice():
    advice = {labels["reason"]: description.split("\n", 1)[1].rsplit(" Journal: ", 1)[0]
              for name, labels, annotations in wording_checks() if name == "XpuUnitEngineInitFailed"
              for description in [annotations["description"]]}
    assert len(set(advice.values())) == len(advice) == len(documented_failure_reasons())


def test_descriptions_quote_the_rendered_duration_and_selector_knobs():
    """Rendered with every `for` knob different: a description that quotes a duration quotes its own alert's."""
    for_knobs = sorted(name for name in render.load_defaults() if name.endswith("For"))
    overrides = {name: f"{17 + index}m" for index, name in enumerate(for_knobs)}
    overrides["selector"] = 'job="gpu",env="lab"'
    quoting = set()
    for rule in alerting_rules_of(render.render(overrides)):
        description = rule["annotations"]["description"]
        for duration in re.findall(r"\bfor (\d+[smhdwy])\b", description):
            assert duration == rule["for"], (rule["alert"], duration)
            quoting.add(rule["alert"])
    assert quoting, "no description quotes its duration"
    absent = next(rule for rule in alerting_rules_of(render.render(overrides)) if rule["alert"] == "XpuExporterAbsent")
    assert overrides["selector"] in absent["annotations"]["description"]


def alerting_rules_of(text: str) -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"] if "alert" in rule]


def test_alerts_follow_the_mixin_naming_severity_and_annotation_conventions():
    for rule in alerting_rules():
        name = rule["alert"]
        assert re.fullmatch(rf"{ALERT_PREFIX}(?:[A-Z][a-z0-9]*)+", name), name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert annotations["summary"].endswith(".") and "{{" not in annotations["summary"], name
        assert annotations["description"].strip(), name
        assert annotations["runbook_url"] == render.load_defaults()["runbookURLPattern"].replace("%s", name.lower()), name


def test_every_runbook_url_leads_to_a_section_with_meaning_diagnosis_and_fix():
    sections = runbook_sections()
    for name in alert_names():
        anchor = alerting_rules_url_anchor(name)
        assert anchor in sections, f"docs/runbook.md has no section '## {name}'"
        for part in ("**Meaning**", "**Diagnosis**", "**Fix**"):
            assert part in sections[anchor], f"runbook section {name} lacks {part}"


@pytest.mark.parametrize("rules_file", [RULES, REPO / "deploy" / "kubernetes" / "base" / "prometheusrule.yaml"],
                         ids=["rules", "kubernetes"])
def test_every_shipped_runbook_url_opens_without_the_exporter(rules_file):
    """Each link starts at Prometheus's own address (its scheme, TLS or not, and a host even when no exporter
    is scraped), never at the firing exporter's: XpuExporterDown's and XpuExporterAbsent's included. What
    is there: the runbook console Prometheus serves, with every alert's section (test_alerting_e2e opens one)."""
    document = yaml.safe_load(rules_file.read_text())
    groups = document.get("spec", document)["groups"]
    urls = {rule["alert"]: rule["annotations"]["runbook_url"] for group in groups for rule in group["rules"]
            if "alert" in rule}
    assert {"XpuExporterDown", "XpuExporterAbsent"} <= urls.keys()
    console = REPO / "deploy" / "prometheus" / "consoles" / "vllm-xpu-exporter-runbook.html"
    for name, url in urls.items():
        assert url == f"{{{{ $externalURL }}}}/consoles/{console.name}#{name.lower()}", (name, url)
        assert f'id="{name.lower()}"' in console.read_text(), name


def alerting_rules_url_anchor(name: str) -> str:
    return next(rule["annotations"]["runbook_url"] for rule in alerting_rules()
                if rule["alert"] == name).rsplit("#", 1)[1]


def vllm_metric_names() -> set[str]:
    """vLLM's own families the rules may read: those docs/discovery.md documents, as served."""
    return set(re.findall(r"`(vllm:[a-z_]+)`", DISCOVERY_DOC.read_text()))


def test_rules_use_only_metrics_the_exporter_serves_or_the_rules_record():
    served = documented_metrics()
    assert served, "no metric table found in the metric reference"
    assert {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total"} <= vllm_metric_names()
    unknown = rules_metric_names() - served - vllm_metric_names() - recorded_names() - {"up"}
    assert unknown == set()


def test_every_recording_rule_is_used_by_an_alert_or_the_dashboard():
    used = dashboard_metric_names(load_dashboard())
    for rule in alerting_rules():
        used |= metric_names(rule["expr"])
    assert recorded_names() - used == set()


def test_every_expression_selects_with_the_selector_knob():
    """The exporter's series with `selector`; vLLM's own (and what the rules record of them, which keeps their
    job) with `vllmSelector`."""
    defaults = render.load_defaults()
    for rule in rules():
        selections = re.findall(r"([a-zA-Z_:][\w:]*)\{([^}]*)\}", rule["expr"])
        assert selections, rule
        for name, selection in selections:
            vllm = name.startswith(("vllm:", "unit:vllm_"))
            assert defaults["vllmSelector" if vllm else "selector"] in selection, (rule.get("record", rule.get("alert")), name)


OVERRIDE_TEST = """\
rule_files: [rules.yaml]
evaluation_interval: 1m
group_eval_order: [vllm-xpu-exporter.rules, vllm-xpu-exporter.alerts]
tests:
  - interval: 1m
    input_series:
      # 7 % free: under the overridden 10 %, over the default 5 %
      - series: 'xpu_memory_free_bytes{instance="a:1",job="gpu",device="0000:03:00.0"}'
        values: '1202590843x10'
      - series: 'xpu_memory_total_bytes{instance="a:1",job="gpu",device="0000:03:00.0"}'
        values: '17179869184x10'
      # the same numbers under a job the selector does not take
      - series: 'xpu_memory_free_bytes{instance="b:1",job="other",device="0000:03:00.0"}'
        values: '1202590843x10'
      - series: 'xpu_memory_total_bytes{instance="b:1",job="other",device="0000:03:00.0"}'
        values: '17179869184x10'
      - series: 'up{instance="a:1",job="gpu"}'
        values: '1x10'
    promql_expr_test:
      - expr: ALERTS{alertname="XpuMemoryNearlyFull",alertstate="firing"}
        eval_time: 1m
        exp_samples: []
      - expr: ALERTS{alertname="XpuMemoryNearlyFull",alertstate="firing"}
        eval_time: 2m
        exp_samples:
          - labels: 'ALERTS{alertname="XpuMemoryNearlyFull",alertstate="firing",severity="critical",instance="a:1",job="gpu",device="0000:03:00.0"}'
            value: 1
      - expr: ALERTS{alertname="XpuExporterAbsent",alertstate="firing"}
        eval_time: 10m
        exp_samples: []
"""


def test_overridden_threshold_duration_severity_and_selector_change_what_fires(tmp_path):
    overrides = {"selector": 'job="gpu"', "memoryNearlyFullFreeRatio": "0.1", "memoryNearlyFullFor": "2m",
                 "memoryNearlyFullSeverity": "critical", "runbookURLPattern": "https://runbooks.example/xpu.html#%s"}
    (tmp_path / "rules.yaml").write_text(render.render(overrides))
    (tmp_path / "override.test.yaml").write_text(OVERRIDE_TEST)
    assert promtool("check", "rules", str(tmp_path / "rules.yaml")).returncode == 0
    result = promtool("test", "rules", str(tmp_path / "override.test.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
    for rule in alerting_rules_of(render.render(overrides)):
        assert rule["annotations"]["runbook_url"] == f"https://runbooks.example/xpu.html#{rule['alert'].lower()}"


# The device alerts' own knobs overridden: the sustained power limit counts as a throttle reason, the
# memory sensor is compared too, above 100 °C. 03 runs at its power limit, its GPU at 97 °C (under the
# overridden threshold), its memory at 101 °C.
DEVICE_KNOBS_TEST = """\
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    external_url: https://prom.example
    input_series:
      - series: 'xpu_frequency_throttled{instance="a:1",job="vllm-xpu-exporter",device="0000:03:00.0",domain="gpu",reason="average_power"}'
        values: '1x30'
      - series: 'xpu_frequency_throttled{instance="a:1",job="vllm-xpu-exporter",device="0000:03:00.0",domain="gpu",reason="thermal"}'
        values: '0x30'
      - series: 'xpu_temperature_celsius{instance="a:1",job="vllm-xpu-exporter",device="0000:03:00.0",sensor="gpu"}'
        values: '97x30'
      - series: 'xpu_temperature_celsius{instance="a:1",job="vllm-xpu-exporter",device="0000:03:00.0",sensor="memory"}'
        values: '101x30'
    alert_rule_test:
      - eval_time: 5m
        alertname: XpuDeviceThrottled
        exp_alerts:
          - exp_labels: {severity: info, instance: "a:1", job: vllm-xpu-exporter, device: "0000:03:00.0", domain: gpu, reason: average_power}
            exp_annotations:
              summary: "A GPU's clock is held down for thermal or power reasons."
              description: "The gpu clock of device 0000:03:00.0 on a:1 has been throttled for 5m, reason average_power; temperatures: gpu 97 °C, memory 101 °C. The units on it run slower than they could.\\nThe card runs at its average_power limit. A busy GPU reaches its power and current limits by design; a software or hardware range means a lower frequency range was set."
              runbook_url: "https://prom.example/consoles/vllm-xpu-exporter-runbook.html#xpudevicethrottled"
      - eval_time: 5m
        alertname: XpuDeviceTemperatureHigh
        exp_alerts:
          - exp_labels: {severity: warning, instance: "a:1", job: vllm-xpu-exporter, device: "0000:03:00.0", sensor: memory}
            exp_annotations:
              summary: "A GPU runs hot."
              description: "The memory temperature of device 0000:03:00.0 on a:1 has been above 100 °C for 5m, now 101 °C. Near its junction limit the card slows down and, past it, shuts down. Check the card's fans and airflow, dust, the room or rack temperature and hot cards next to it."
              runbook_url: "https://prom.example/consoles/vllm-xpu-exporter-runbook.html#xpudevicetemperaturehigh"
"""


def test_overridden_throttle_reasons_and_temperature_sensors_and_threshold_change_what_fires(tmp_path):
    overrides = {"deviceThrottledReasons": "average_power|thermal", "deviceThrottledFor": "5m",
                 "deviceThrottledSeverity": "info", "temperatureSensorSelector": 'sensor=~"gpu|memory"',
                 "temperatureHighCelsius": "100", "temperatureHighFor": "5m"}
    (tmp_path / "rules.yaml").write_text(render.render(overrides))
    (tmp_path / "device-knobs.test.yaml").write_text(DEVICE_KNOBS_TEST)
    assert promtool("check", "rules", str(tmp_path / "rules.yaml")).returncode == 0
    result = promtool("test", "rules", str(tmp_path / "device-knobs.test.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr


# Two exporters of job "gpu" whose journal collectors watch no unit for 90 minutes; b:1 is a host
# without vLLM units. The test expects the instances listed in `firing` to have the alert at 90 minutes.
NO_UNITS_TEST = """\
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'xpu_exporter_journal_units_watched{instance="a:1",job="gpu"}'
        values: '0x90'
      - series: 'xpu_exporter_journal_units_watched{instance="b:1",job="gpu"}'
        values: '0x90'
    promql_expr_test:
      - expr: count by (instance) (ALERTS{alertname="XpuExporterNoUnitsWatched",alertstate="firing"})
        eval_time: 90m
        exp_samples: %s
"""


@pytest.mark.parametrize("units_expected, firing", [
    (None, ["a:1", "b:1"]),  # the default follows the overridden selector
    ('instance!="b:1"', ["a:1"]),
    ('job!~".*"', []),  # the documented value that turns the alert off
])
def test_the_units_expected_selector_chooses_which_exporters_must_watch_units(tmp_path, units_expected, firing):
    overrides = {"selector": 'job="gpu"'}
    if units_expected is not None:
        overrides["unitsExpectedSelector"] = units_expected
    (tmp_path / "rules.yaml").write_text(render.render(overrides))
    samples = [{"labels": f'{{instance="{instance}"}}', "value": 1} for instance in firing]
    (tmp_path / "no-units.test.yaml").write_text(NO_UNITS_TEST % yaml.safe_dump(samples, default_flow_style=True).strip())
    assert promtool("check", "rules", str(tmp_path / "rules.yaml")).returncode == 0
    result = promtool("test", "rules", str(tmp_path / "no-units.test.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_cluster_label_knob_keeps_clusters_apart_by_the_label_it_names(tmp_path):
    """The two-cluster cases, their clusters told apart by `region` instead: rendered with
    clusterLabel=region they pass; with the default (cluster), which these series lack, they fail."""
    cases = (REPO / "rules" / "tests" / "two-clusters.test.yaml").read_text().replace('{cluster="', '{region="') \
        .replace(',cluster="', ',region="')
    assert 'cluster="' not in cases.split("tests:", 1)[1]
    (tmp_path / "cases.test.yaml").write_text(cases.replace("../vllm-xpu-exporter.yaml", "rules.yaml"))
    (tmp_path / "rules.yaml").write_text(render.render({"clusterLabel": "region"}))
    result = promtool("test", "rules", str(tmp_path / "cases.test.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
    (tmp_path / "rules.yaml").write_text(render.render())
    assert promtool("test", "rules", str(tmp_path / "cases.test.yaml")).returncode != 0


def test_the_command_line_renders_values_files_and_assignments(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(textwrap.dedent("""\
        selector: job="gpu",cluster="lab"
        engineInitFailedWindow: 30m
        exporterDownSeverity: info
        """))
    output = tmp_path / "rules.yaml"
    result = subprocess.run([sys.executable, str(REPO / "rules" / "render.py"), "--values", str(values),
                             "--set", "exporterDownSeverity=critical", "-o", str(output)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    expected = render.render({"selector": 'job="gpu",cluster="lab"', "engineInitFailedWindow": "30m",
                              "exporterDownSeverity": "critical"})
    assert output.read_text() == expected
    rendered = {rule.get("alert") or rule["record"]: rule for rule in rules(output)}
    assert rendered["XpuExporterDown"]["labels"]["severity"] == "critical"
    assert "< 1800)" in rendered["XpuUnitEngineInitFailed"]["expr"]
    assert 'up{job="gpu",cluster="lab"}' in rendered["XpuExporterDown"]["expr"]
    assert promtool("check", "rules", str(output)).returncode == 0


@pytest.mark.parametrize("knob, value, message", [
    ("noSuchKnob", "1", "unknown knob"),
    ("memoryNearlyFullFor", "15 minutes", "not a Prometheus duration"),
    ("engineInitFailedWindow", "-5m", "not a Prometheus duration"),
    ("exporterDownSeverity", "page", "severity must be one of"),
    ("memoryNearlyFullFreeRatio", "5", "a ratio is a number from 0 to 1"),
    ("restartHeadroomThresholdBytes", "1GiB", "a number of bytes"),
    ("temperatureHighCelsius", "95C", "a number of degrees Celsius"),
    ("deviceThrottledReasons", "thermal|hot", "not a throttle reason: 'hot'"),
    ("deviceThrottledReasons", "thermal|", "not a throttle reason: ''"),
    ("temperatureSensorSelector", 'sensor="gpu"}', "label matchers without braces"),
    ("selector", '{job="x"}', "label matchers without braces"),
    ("unitsExpectedSelector", "", "label matchers without braces"),
    ("runbookURLPattern", "http://{{ $labels.instance }}/runbook#%s", "takes nothing from the firing series"),
    ("runbookURLPattern", "http:///runbook#%s", "starts with"),
    ("runbookURLPattern", "https://docs.example/runbook", "one %s where"),
    ("runbookUrl", "https://docs.example/runbook", "is now runbookURLPattern"),
    ("clusterLabel", "my-cluster", "a Prometheus label name"),
])
def test_bad_knob_values_are_refused_with_a_message(knob, value, message):
    with pytest.raises(render.RenderError, match=message):
        render.render({knob: value})
    result = subprocess.run([sys.executable, str(REPO / "rules" / "render.py"), "--set", f"{knob}={value}"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2 and message in result.stderr and result.stdout == ""


def test_a_value_that_would_break_the_yaml_is_refused():
    with pytest.raises(yaml.YAMLError):
        render.render({"runbookURLPattern": "https://x/%s\"\n  broken: [yaml"})


def test_the_knob_list_prints_every_knob_with_its_default():
    result = subprocess.run([sys.executable, str(REPO / "rules" / "render.py"), "--list"],
                            capture_output=True, text=True, check=True)
    listed = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert listed == render.load_defaults()


def test_the_kv_bytes_of_the_usage_cases_are_those_the_journal_grammar_reads():
    """rules/tests/vllm-usage.test.yaml's KV bytes are the exporter's figures of the journal lines it names, so
    its used bytes are the journal's KV bytes times vLLM's usage, to the byte."""
    from vllm_xpu_exporter.parsers.vllm import parse_line

    text = (REPO / "rules" / "tests" / "vllm-usage.test.yaml").read_text()
    for line, unit in (("Available KV cache memory: 3.36 GiB", "vllm-xpu-chat.service"),
                       ("Available KV cache memory: 0.75 GiB", "vllm-xpu-embedding.service")):
        kv_bytes = parse_line(line).kv_cache_bytes
        assert f'{kv_bytes} bytes' in text
        values = re.findall(rf"xpu_unit_kv_cache_bytes\{{[^}}]*unit=\"{re.escape(unit)}\"\}}'\n\s+values: '(\d+)x", text)
        assert values and set(values) == {str(kv_bytes)}, unit
    case = rule_test_cases(REPO / "rules" / "tests" / "vllm-usage.test.yaml")[0]
    series = {check["labels"]: check["value"] for check in case["promql_expr_test"][0]["exp_samples"]}
    usage = {re.search(r'unit="([^"]+)"', item["series"]).group(1): float(item["values"].split("x")[0])
             for item in case["input_series"] if item["series"].startswith("vllm:")}
    kv = {re.search(r'unit="([^"]+)"', item["series"]).group(1): int(item["values"].split("x")[0])
          for item in case["input_series"] if item["series"].startswith("xpu_unit_kv_cache_bytes")}
    for labels, value in series.items():
        unit = re.search(r'unit="([^"]+)"', labels).group(1)
        assert value == kv[unit] * usage[unit]


def test_rule_test_files_name_the_bundled_rules():
    for path in RULE_TESTS:
        files = yaml.safe_load(path.read_text())["rule_files"]
        assert [(path.parent / file).resolve() for file in files] == [Path(RULES).resolve()]


def test_the_operator_doc_lists_every_alert_with_its_severities():
    listed = dict(re.findall(r"^\| `(Xpu\w+)` \| ([a-z /]+) \|", OPERATOR_DOC.read_text(), re.M))
    assert set(listed) == alert_names()
    for name, severities in listed.items():
        assert set(severities.split(" / ")) == {rule["labels"]["severity"] for rule in alerting_rules()
                                                 if rule["alert"] == name}, name



def test_the_operator_doc_alertmanager_example_is_valid(tmp_path):
    example = re.search(r"```yaml\n(.*?)```", OPERATOR_DOC.read_text(), re.S).group(1)
    config = yaml.safe_load(example)
    config["receivers"] = [{"name": "oncall"}, {"name": "dashboard-only"}]
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_runbook_names_the_logs_command_of_every_kind_of_unit():
    """systemd units, Docker and Podman containers and pods' containers: each kind's own logs command, in the
    runbook's table and in XpuUnitEngineInitFailed's diagnosis."""
    commands = ("journalctl -b -u", "docker logs", "podman logs", "kubectl logs -n <namespace> <pod> -c <container> --previous")
    runbook = (REPO / "docs" / "runbook.md").read_text()
    assert all(command in runbook for command in commands)
    assert all(command in runbook_sections()["xpuunitengineinitfailed"] for command in commands)


def test_every_alert_text_that_recommends_the_gate_says_it_cannot_gate_containers():
    recommending = {rule["alert"]: rule["annotations"]["description"] for rule in alerting_rules()
                    if "vllm-xpu-gate" in rule["annotations"].get("description", "")}
    assert recommending
    for name, description in recommending.items():
        assert "it cannot gate containers" in description, name
