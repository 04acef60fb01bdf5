"""End to end, for real: the exporter over the fake Level Zero driver, a fixture /proc and a journal of
the problem statement's boot race; Debian's Prometheus scraping it every second with the bundled rules;
Debian's Alertmanager routing to a webhook receiver in this test.

The race is replayed live in two phases. Phase 1: the three units started together, chat's engine
failed (kv_cache_too_small: 2.13 GiB available, 3.36 GiB needed) and chat is down. Phase 2: chat's
lone restart succeeded and holds its memory. The GPU carries every kind of device telemetry: its clock
is throttled by its thermal limit (an alert) and its sustained power limit (no alert), and in phase 2
it counts a second uncorrectable RAS error (an alert; the first, counted before Prometheus started, is
none). The rules are a test copy rendered with the state alerts' `for:` at 0s, so what would fire after
minutes fires at once; everything else is as shipped.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

import journalgen
from exporterproc import RunningExporter
from fakeprocfs import XE_DEFAULT_CYCLES, XE_DEFAULT_TOTAL_CYCLES, FakeProcfs, xe_fdinfo
from fakeze import (A770_TELEMETRY, ZES_RAS_ERROR_TYPE_UNCORRECTABLE, FakeConfig, FakeRas,
                    fake_driver_env, write_config)
from polling import wait_for
from promql import (REPO, alerting_rules, dashboard_queries, load_dashboard, metric_names,
                    recorded_names, variable_queries)
from promstack import Alertmanager, Prometheus, Webhook
from scrapes import sample, series
from sizes import GiB, MiB
from vllmlogs import CHAT, EMBEDDING, STT, UNWATCHED, BootRace, boot_race, journal_specs

sys.path.insert(0, str(REPO / "rules"))
import render  # noqa: E402

DEVICE = "0000:03:00.0"
TOTAL = 16 * GiB
HELD = {EMBEDDING: 1 * GiB, STT: 1 * GiB, "session-3.scope": 256 * MiB}
CHAT_HOLDS = 11 * GiB + 512 * MiB
UNATTRIBUTED = 512 * MiB
JOB = "vllm-xpu-exporter"
# The alerts whose `for:` the test copy sets to 0s: every alert this scenario could raise by mistake.
STATE_ALERT_DURATIONS = ("kvCacheTooSmallFor", "kvCacheBelowMaxNumSeqsFor", "restartHeadroomFor",
                         "memoryNearlyFullFor", "memoryAccountingUntrustedFor", "unattributedMemoryFor",
                         "noUnitsWatchedFor", "memoryUnhealthyFor", "deviceThrottledFor", "temperatureHighFor")
RATE_INTERVAL = "4s"  # Grafana's $__rate_interval for a 1 s scrape interval: 4 x scrape interval
SETTLE = 30  # seconds any state may take to show up (a deadline, not an expectation)

INIT_FAILED_ADVICE = (
    "Give the KV cache room for one max-length request: raise gpu_memory_utilization, or set "
    "kv_cache_memory_bytes to at least the needed figure, or lower max_model_len. If the unit starts fine "
    "alone, it lost a race with other units initialising on the same GPU: gate their starts with vllm-xpu-gate "
    "(docs/gate.md; systemd units only, it cannot gate containers), or order them (After= in the unit files, one "
    "container after the other), so they initialise one after the other. "
    "Journal: journalctl -b -u vllm-xpu-chat.service")


# A770_TELEMETRY's uncorrectable RAS set counted one reset before the exporter started.
UNCORRECTABLE_RESETS_BEFORE = A770_TELEMETRY.ras[1].categories[0]


def device_with(used: int, uncorrectable_resets: int = UNCORRECTABLE_RESETS_BEFORE) -> FakeConfig:
    """The A770 with every kind of telemetry, `used` bytes of its memory used and this many uncorrectable resets."""
    correctable, uncorrectable = A770_TELEMETRY.ras
    assert uncorrectable.type == ZES_RAS_ERROR_TYPE_UNCORRECTABLE
    memory = dataclasses.replace(A770_TELEMETRY.memory[0], size=TOTAL, free=TOTAL - used)
    ras = (correctable, FakeRas(uncorrectable.type, (uncorrectable_resets, *uncorrectable.categories[1:])))
    return FakeConfig(devices=(dataclasses.replace(A770_TELEMETRY, memory=(memory,), processes=(), ras=ras),))


def go_time(seconds: float) -> str:
    """Prometheus's humanizeTimestamp: milliseconds, Go's time.Time string in UTC."""
    millis = int(seconds * 1e9) // 1_000_000
    moment = datetime.fromtimestamp(millis // 1000, timezone.utc)
    fraction = f".{millis % 1000:03d}".rstrip("0").rstrip(".")
    return moment.strftime("%Y-%m-%d %H:%M:%S") + fraction + " +0000 UTC"


@dataclass
class Stack:
    exporter: RunningExporter
    prometheus: Prometheus
    alertmanager: Alertmanager
    webhook: Webhook
    race: BootRace
    instance: str
    started: float  # when Prometheus started (Unix time)
    phase1_firing: set
    phase2_firing: set


def firing(prometheus: Prometheus) -> set[tuple[str, str]]:
    return {(alert["labels"]["alertname"], alert["labels"].get("unit") or alert["labels"].get("device") or "")
            for alert in prometheus.alerts() if alert["state"] == "firing"}


def steady_firing(prometheus: Prometheus, expected: set, evaluations: int = 3) -> set:
    """The firing set once it equals `expected` (or the deadline passed) and stayed so for a few more
    evaluations: an alert that should not fire has had its chance to."""
    wait_for(lambda: firing(prometheus) == expected, SETTLE)
    time.sleep(evaluations)
    return firing(prometheus)


@pytest.fixture(scope="module")
def stack(fake_driver: Path, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("alerting")
    race = boot_race(origin=time.time() - 180)  # a recent failure
    before_restart, from_restart = race.split_at_chat_restart()
    journal = journalgen.write_journal(base / "units.journal", journal_specs(before_restart))
    config = base / "fake_ze.conf"
    procfs = FakeProcfs(base / "host")
    for pid, (unit, held) in enumerate(HELD.items(), start=200):
        cgroup = f"/system.slice/{unit}" if unit.endswith(".service") else f"/user.slice/user-1000.slice/{unit}"
        procfs.add_unit_process(pid, cgroup).add_drm_fd(xe_fdinfo(client_id=pid, vram0=held))
    write_config(config, device_with(sum(HELD.values()) + UNATTRIBUTED))

    rules = base / "rules.yaml"
    rules.write_text(render.render({knob: "0s" for knob in STATE_ALERT_DURATIONS}))
    processes = []
    try:
        webhook = Webhook()
        processes.append(webhook)
        exporter = RunningExporter(["--path.procfs", str(procfs.root), "--journal.file", str(journal),
                                    "--journal.boot", race.boot_id], env=fake_driver_env(fake_driver, config))
        processes.append(exporter)
        settled = wait_for(lambda: (s := exporter.scrape()) and all(
            sample(s, "xpu_exporter_collector_success", collector=name) == 1
            for name in ("levelzero", "processes", "journal")) and
            sample(s, "xpu_unit_engine_init_failures_total", unit=CHAT, reason="kv_cache_too_small") == 1 and
            series(s, "xpu_unit_restart_headroom_bytes") and s, timeout=SETTLE)
        assert settled, exporter.stderr
        alertmanager = Alertmanager(base / "alertmanager", webhook.url)
        processes.append(alertmanager)
        instance = exporter.base_url.split("//", 1)[1]
        started = time.time()
        prometheus = Prometheus(base / "prometheus", [instance], [rules], alertmanager.address, job=JOB)
        processes.append(prometheus)

        phase1 = steady_firing(prometheus, {
            ("XpuUnitEngineInitFailed", CHAT), ("XpuUnitKvCacheTooSmall", CHAT),
            ("XpuUnitEngineInitsOverlapped", CHAT), ("XpuUnitEngineInitsOverlapped", EMBEDDING),
            ("XpuUnitEngineInitsOverlapped", STT), ("XpuDeviceThrottled", DEVICE)})
        wait_for(lambda: any(alert["labels"]["alertname"] == "XpuUnitEngineInitFailed"
                             for alert in webhook.alerts()), SETTLE)
        # The units' engines get busy: their fdinfo engine counters advance (Engine busy by unit).
        for pid, (unit, held) in enumerate(HELD.items(), start=200):
            process = procfs.processes[pid]
            (process.path / "fdinfo" / str(process.fds[0])).write_text(
                xe_fdinfo(client_id=pid, vram0=held, cycles={"ccs": XE_DEFAULT_CYCLES + 1000},
                          total_cycles=XE_DEFAULT_TOTAL_CYCLES + 4000))

        # Phase 2: chat's lone restart, as the journal, /proc and the driver see it.
        journalgen.append_journal(journal, journal_specs(from_restart))
        chat = procfs.add_unit_process(100, f"/system.slice/{CHAT}")
        chat.add_drm_fd(xe_fdinfo(client_id=100, vram0=CHAT_HOLDS))
        write_config(config, device_with(sum(HELD.values()) + CHAT_HOLDS + UNATTRIBUTED,
                                         uncorrectable_resets=UNCORRECTABLE_RESETS_BEFORE + 1))
        restarted = wait_for(lambda: (s := exporter.scrape()) and
                             sample(s, "xpu_unit_engine_starts_total", unit=CHAT) == 1 and
                             sample(s, "xpu_unit_memory_bytes", device=DEVICE, unit=CHAT) == CHAT_HOLDS and
                             sample(s, "xpu_ras_errors_total", device=DEVICE, severity="uncorrectable",
                                    category="reset") == UNCORRECTABLE_RESETS_BEFORE + 1 and s,
                             timeout=SETTLE)
        assert restarted, exporter.stderr
        phase2 = steady_firing(prometheus, {
            ("XpuUnitEngineInitFailed", CHAT), ("XpuUnitKvCacheBelowMaxNumSeqs", CHAT),
            ("XpuUnitEngineInitsOverlapped", CHAT), ("XpuUnitEngineInitsOverlapped", EMBEDDING),
            ("XpuUnitEngineInitsOverlapped", STT), ("XpuDeviceThrottled", DEVICE),
            ("XpuDeviceUncorrectableErrors", DEVICE)})
        # a rate over the dashboard's window needs that many seconds of scrapes after the change
        wait_for(lambda: time.time() - started > 6, SETTLE)
        yield Stack(exporter, prometheus, alertmanager, webhook, race, instance, started, phase1, phase2)
    finally:
        for process in reversed(processes):
            (process.close if isinstance(process, Webhook) else process.stop)()


def test_init_failure_of_chat_reaches_the_webhook_with_its_labels_and_the_failures_figures(stack: Stack):
    alerts = [alert for alert in stack.webhook.alerts() if alert["labels"]["alertname"] == "XpuUnitEngineInitFailed"]
    assert alerts, stack.alertmanager.log()
    first = alerts[0]
    assert first["labels"] == {"alertname": "XpuUnitEngineInitFailed", "severity": "warning", "job": JOB,
                               "instance": stack.instance, "unit": CHAT, "reason": "kv_cache_too_small"}
    failed_at = go_time(stack.race.chat_failure_usec() / 1e6)
    assert first["annotations"] == {
        "summary": "A vLLM unit's engine failed to initialise.",
        "description": f"{CHAT} on {stack.instance} failed to initialise its vLLM engine: kv_cache_too_small "
                       f"(latest failure {failed_at}). KV cache of the latest start: 2.13GiB. Needed for one "
                       f"request of max_model_len: 3.36GiB. gpu_memory_utilization: 0.75. max_model_len: 131072.\n"
                       + INIT_FAILED_ADVICE,
        "runbook_url": f"{stack.prometheus.url}/consoles/vllm-xpu-exporter-runbook.html#xpuunitengineinitfailed",
    }
    # the link leads somewhere real, the exporter not asked: Prometheus serves the runbook's console
    with urllib.request.urlopen(first["annotations"]["runbook_url"], timeout=10) as response:
        assert response.status == 200 and 'id="xpuunitengineinitfailed"' in response.read().decode()
    # one alert for the one failure: no other unit's, no other reason's
    assert {(alert["labels"]["unit"], alert["labels"]["reason"]) for alert in alerts} == {(CHAT, "kv_cache_too_small")}


def test_only_the_alerts_the_race_explains_fire_before_and_after_the_restart(stack: Stack):
    overlapped = {("XpuUnitEngineInitsOverlapped", unit) for unit in (CHAT, EMBEDDING, STT)}
    throttled = {("XpuDeviceThrottled", DEVICE)}
    assert stack.phase1_firing == {("XpuUnitEngineInitFailed", CHAT), ("XpuUnitKvCacheTooSmall", CHAT)} | \
        overlapped | throttled
    assert stack.phase2_firing == {("XpuUnitEngineInitFailed", CHAT), ("XpuUnitKvCacheBelowMaxNumSeqs", CHAT),
                                   ("XpuDeviceUncorrectableErrors", DEVICE)} | overlapped | throttled
    assert not any(alert["labels"].get("unit") == UNWATCHED for alert in stack.webhook.alerts())


def test_the_kv_alert_resolves_when_the_lone_restart_fits_a_request(stack: Stack):
    resolved = wait_for(lambda: [alert for alert in stack.webhook.alerts("resolved")
                                 if alert["labels"]["alertname"] == "XpuUnitKvCacheTooSmall"], SETTLE)
    assert {alert["labels"]["unit"] for alert in resolved} == {CHAT}
    info = next(alert for alert in stack.prometheus.alerts()
                if alert["labels"]["alertname"] == "XpuUnitKvCacheBelowMaxNumSeqs")
    assert info["labels"]["severity"] == "info"
    assert info["annotations"]["description"].startswith(
        f"The KV cache of {CHAT} on {stack.instance} holds 1.04 requests of max_model_len at once, fewer than "
        "its max_num_seqs of 3")


def test_device_alerts_reach_the_webhook_for_the_thermal_throttle_and_the_new_uncorrectable_error(stack: Stack):
    throttled = wait_for(lambda: [alert for alert in stack.webhook.alerts()
                                  if alert["labels"]["alertname"] == "XpuDeviceThrottled"], SETTLE)
    assert throttled, stack.alertmanager.log()
    # thermal only: the sustained power limit the GPU is also at is where a busy GPU runs by design
    assert sample(stack.exporter.scrape(), "xpu_frequency_throttled", device=DEVICE, domain="gpu",
                  reason="average_power") == 1
    assert all(alert["labels"] == {"alertname": "XpuDeviceThrottled", "severity": "warning", "job": JOB,
                                   "instance": stack.instance, "device": DEVICE, "domain": "gpu", "reason": "thermal"}
               for alert in throttled), [alert["labels"] for alert in throttled]
    assert throttled[0]["annotations"]["description"].startswith(
        f"The gpu clock of device {DEVICE} on {stack.instance} has been throttled for 0s, reason thermal, now at "
        "2.1GHz; temperatures: global 71.5 °C, gpu 68 °C, memory 74 °C.")
    errors = wait_for(lambda: [alert for alert in stack.webhook.alerts()
                               if alert["labels"]["alertname"] == "XpuDeviceUncorrectableErrors"], SETTLE)
    assert errors, stack.alertmanager.log()
    assert all(alert["labels"] == {"alertname": "XpuDeviceUncorrectableErrors", "severity": "critical", "job": JOB,
                                   "instance": stack.instance, "device": DEVICE, "category": "reset"}
               for alert in errors), [alert["labels"] for alert in errors]
    assert errors[0]["annotations"]["description"].startswith(
        f"Device {DEVICE} on {stack.instance} counted uncorrectable reset errors in the last 1h "
        f"({UNCORRECTABLE_RESETS_BEFORE + 1} since the driver loaded).")


def grafana_regex(values: list[str]) -> str:
    """A multi-value variable with every value selected, as Grafana writes it into a Prometheus regex
    matcher: the values regex-escaped (backslashes doubled inside the PromQL string), joined by |."""
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", value) for value in values]
    return "(" + "|".join(escaped) + ")"


def resolved_variables(stack: Stack) -> dict[str, str]:
    """The dashboard's variables as Grafana resolves them against this Prometheus: cluster and job All (their
    first option; this stack's series have no cluster label), instance and device the first value, unit All."""
    dashboard = load_dashboard()
    settings = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    values: dict[str, str] = {}
    for name, (selector, label) in variable_queries(dashboard).items():
        if "allValue" in settings[name]:
            values[name] = settings[name]["allValue"]
            continue
        found = stack.prometheus.label_values(label, substitute(selector, values) if selector else None)
        assert found, f"variable {name} lists nothing"
        values[name] = grafana_regex(found) if name == "unit" else found[0]
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(f"${name}", values[name])
    return expr.replace("$__rate_interval", RATE_INTERVAL)


def test_dashboard_variables_list_the_scenarios_instance_device_and_units(stack: Stack):
    values = resolved_variables(stack)
    assert values["instance"] == stack.instance
    assert values["device"] == DEVICE
    assert values["unit"] == grafana_regex(sorted([CHAT, EMBEDDING, STT]))


# Series this stack cannot produce, and where they are shown with data instead: vLLM's own series (and the
# rules over them) come from the units' API servers, which the race's replayed engines do not run
# (tests/http/test_discovery.py: a real Prometheus scraping stub vLLM servers through /sd/vllm); the free memory
# vLLM saw at a start is printed by vLLM 0.26 and later only, and the race's engines are 0.24
# (tests/collectors/test_start_free_memory.py); a plan's budget and the one a start ran with exist only once a plan is applied,
# and the race is the unplanned boot (tests/real_systemd/test_planner_applied_real_systemd.py: the packaged exporter beside
# planned units, the alert's expression evaluated by promtool).
# vLLM's own startup plan and sleep mode are vLLM 0.34's (VLLM_ENABLE_STARTUP_PLAN=1, --enable-sleep-mode): their
# series come from tests/sources/test_journal_versions.py's 0.34 starts and tests/collectors/test_attribution.py's sleeping units.
NOT_IN_THE_RACE = {"xpu_unit_engine_start_free_memory_bytes", "xpu_unit_kv_cache_plan_bytes",
                   "xpu_unit_kv_cache_budget_bytes", "xpu_unit_startup_plan_state", "xpu_unit_startup_plan_bytes",
                   "xpu_unit_startup_plan_fallbacks_total", "xpu_unit_wake_memory_bytes"}


def not_in_the_race(names: set[str]) -> bool:
    return any(name.startswith(("vllm:", "unit:vllm_")) or name in NOT_IN_THE_RACE for name in names)


def test_every_dashboard_panel_query_returns_data(stack: Stack):
    values = resolved_variables(stack)
    now = time.time()
    empty = []
    for where, target in dashboard_queries(load_dashboard()):
        if not_in_the_race(metric_names(target["expr"])):
            continue
        expr = substitute(target["expr"], values)
        assert "$" not in expr, where
        if target.get("instant"):
            result = stack.prometheus.query(expr, now)
            points = [float(item["value"][1]) for item in result]
        else:
            result = stack.prometheus.query_range(expr, stack.started, now, step=1)
            points = [float(value) for item in result for _, value in item["values"]]
        if not [point for point in points if not math.isnan(point)]:
            empty.append(f"{where}: {expr}")
    assert empty == []


def test_the_failure_annotation_marks_the_time_chat_failed(stack: Stack):
    annotation = load_dashboard()["annotations"]["list"][0]
    result = stack.prometheus.query_range(substitute(annotation["expr"], resolved_variables(stack)),
                                          stack.started, time.time(), step=1)
    marked = [(item["metric"]["unit"], float(value)) for item in result for _, value in item["values"]]
    assert {unit for unit, _ in marked} == {CHAT}
    # milliseconds, as Grafana takes them with useValueForTime; float arithmetic, so to a microsecond
    assert [millis for _, millis in marked] == pytest.approx([stack.race.chat_failure_usec() / 1e3] * len(marked), abs=1e-3)


def test_every_metric_the_alerts_and_dashboard_select_is_served_in_the_race(stack: Stack):
    served = {name for name, _ in stack.exporter.scrape()}
    selected = set()
    for rule in alerting_rules():
        selected |= metric_names(rule["expr"])
    for _, target in dashboard_queries(load_dashboard()):
        selected |= metric_names(target["expr"])
    assert {name for name in selected - served - recorded_names() - {"up"} if not not_in_the_race({name})} == set()
    assert stack.prometheus.targets_up()
