#!/usr/bin/env python3
"""Builds the bundled Grafana dashboard from the panel list below: the monitoring mixin's dashboard template
(mixin/dashboard.json), and grafana/vllm-xpu-exporter.json, which is the mixin's dashboard with its default
knobs (mixin/dashboard.jsonnet, evaluated with the jsonnet package).

    python3 grafana/dashboard.py            # rewrite mixin/dashboard.json and grafana/vllm-xpu-exporter.json
    python3 grafana/dashboard.py --check    # exit 1 if either is not what this file builds
    python3 grafana/dashboard.py --values my-values.yaml > my-dashboard.json   # for your rules' knobs

Every panel gets a unit and thresholds; every query goes through the `datasource` variable, whose
default is the data source picked at import (`__inputs` DS_PROMETHEUS), so no data source uid is
written down. Queries use the metrics the exporter serves (and `up`); only the *Engine busy by unit*
panel needs a recording rule of rules/vllm-xpu-exporter.yaml (`unit:xpu_unit_engine_busy:ratio`, which
joins the two drivers' counters), so the other panels work without the bundled rules. The selectors, the
cluster label, and the thresholds and durations of the alerts that panels show are the rules' knobs
(mixin/config.libsonnet): the template holds them as ${knob} placeholders (`knob()`), which the mixin fills
in from its config, as it does the rules'. `--values` and `--set` take the same overrides as
rules/render.py. Usable from a shell: `dashboard()` returns the template, `render(overrides)` the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "rules"))
from render import (MIXIN, RenderError, evaluate, knob_values, load_values,  # noqa: E402  (a script beside the rules)
                    parse_assignments)

OUTPUT = Path(__file__).resolve().parent / "vllm-xpu-exporter.json"
TEMPLATE = MIXIN / "dashboard.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24

# Selectors of the dashboard's variables. SCOPE is the exporter the variables choose, within the rules'
# `selector` knob and the cluster, job and instance variables, so two clusters' or two jobs' same-named hosts
# never mix in a panel. The ${knob} placeholders are the mixin's (mixin/lib/template.libsonnet): it fills them
# in from its config, as it does the rules'.
SCOPE = '${selector},${clusterLabel}=~"$cluster",job=~"$job",instance="$instance"'
DEVICE = f'{SCOPE},device="$device"'
UNITS = f'{SCOPE},unit=~"$unit"'
EXPORTER = SCOPE
# The same for the series recorded from vLLM's own (unit:vllm_*): the rules' `vllmSelector` and vLLM's job,
# with the exporter's instance and the cluster (docs/discovery.md).
VLLM_SCOPE = '${vllmSelector},${clusterLabel}=~"$cluster",instance="$instance"'
VLLM_UNITS = f'{VLLM_SCOPE},unit=~"$unit"'

Json = dict[str, Any]


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


@dataclass(frozen=True)
class Panel:
    kind: str  # timeseries, stat, bargauge, table, state-timeline
    title: str
    description: str
    targets: Sequence[Target]
    unit: str
    thresholds: Sequence[tuple[float | None, str]]  # (from value, colour); the first is the base (None)
    width: int
    height: int
    options: Json = field(default_factory=dict)
    custom: Json = field(default_factory=dict)
    defaults: Json = field(default_factory=dict)  # more of fieldConfig.defaults (min, decimals, mappings)
    overrides: Sequence[Json] = ()
    transformations: Sequence[Json] = ()


@dataclass(frozen=True)
class Row:
    title: str
    panels: Sequence[Panel]


def green_only() -> list[tuple[float | None, str]]:
    return [(None, "green")]


def value_mapping(states: dict[int, tuple[str, str]]) -> list[Json]:
    return [{"type": "value",
             "options": {str(value): {"text": text, "color": colour, "index": index}
                         for index, (value, (text, colour)) in enumerate(states.items())}}]


def override(matcher: str, options: str, properties: dict[str, Any]) -> Json:
    return {"matcher": {"id": matcher, "options": options},
            "properties": [{"id": key, "value": value} for key, value in properties.items()]}


def by_name(name: str, properties: dict[str, Any]) -> Json:
    return override("byName", name, properties)


def by_name_regex(pattern: str, properties: dict[str, Any]) -> Json:
    return override("byRegexp", pattern, properties)


def thresholds_json(thresholds: Sequence[tuple[float | None, str]]) -> Json:
    return {"mode": "absolute", "steps": [{"value": value, "color": colour} for value, colour in thresholds]}


TIMESERIES_CUSTOM: Json = {
    "drawStyle": "line", "lineInterpolation": "stepAfter", "lineWidth": 1, "fillOpacity": 10,
    "showPoints": "never", "spanNulls": False, "axisPlacement": "auto",
    "stacking": {"mode": "none", "group": "A"}, "thresholdsStyle": {"mode": "off"},
}
LEGEND_TABLE: Json = {"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]},
                      "tooltip": {"mode": "multi", "sort": "desc"}}
LEGEND_LIST: Json = {"legend": {"displayMode": "list", "placement": "bottom", "calcs": []},
                     "tooltip": {"mode": "multi", "sort": "none"}}
STAT_OPTIONS: Json = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                      "colorMode": "value", "graphMode": "none", "textMode": "value", "justifyMode": "auto",
                      "orientation": "auto"}
BARGAUGE_OPTIONS: Json = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                          "displayMode": "gradient", "orientation": "horizontal", "showUnfilled": True}
STATE_TIMELINE_OPTIONS: Json = {"showValue": "never", "mergeValues": True, "alignValue": "left", "rowHeight": 0.8,
                                **LEGEND_LIST}

def knob(name: str, form: str = "") -> str:
    """The placeholder of a rules' knob, which the mixin fills in (mixin/lib/template.libsonnet): as the knob
    is (no `form`), or `words` (a duration: "15 minutes"), `percent` (a ratio: "5 %"), `bytes` ("512 MiB"),
    `list` (reasons joined by |: "thermal, psu"), `number` (a number; a threshold's value when it is the whole
    string) or `doubledRatio` (twice a ratio, at most 1: a threshold's value)."""
    return f"${{{name}:{form}}}" if form else f"${{{name}}}"


def fixed_colour(colour: str) -> Json:
    return {"mode": "fixed", "fixedColor": colour}


# The kernel's per-client engine keys (i915, then xe): each engine's units stack on their own.
UNIT_ENGINE_KEYS = ("render", "copy", "video", "video-enhance", "compute", "rcs", "bcs", "vcs", "vecs", "ccs")

# The fraction of one max-length request the latest start's KV cache holds, as the rules compute it.
MAX_LENGTH_REQUESTS = (f"xpu_unit_kv_cache_bytes{{{UNITS}}} / xpu_unit_kv_cache_required_bytes{{{UNITS}}}"
                       f" or xpu_unit_kv_cache_max_concurrency{{{UNITS}}}")


DASHED_LINE: Json = {"custom.lineStyle": {"fill": "dash", "dash": [10, 10]}, "custom.fillOpacity": 0}


def dashed(pattern: str) -> Json:
    """Series whose display name matches `pattern` drawn as a dashed line without fill: what the others are
    compared with (a need, a limit, a target)."""
    return by_name_regex(pattern, DASHED_LINE)


def stacked_against(title: str, description: str, targets: Sequence[Target], limit: str,
                    overrides: Sequence[Json] = ()) -> Panel:
    """Bytes stacked per series against one unstacked dashed red series, the one named `limit`."""
    limit_style = by_name_regex(f"^{limit}$", {"custom.stacking": {"mode": "none", "group": "A"}, **DASHED_LINE,
                                               "color": fixed_colour("red")})
    return Panel("timeseries", title, description, targets, "bytes", green_only(), 16, 8, options=LEGEND_TABLE,
                 custom={"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 40}, defaults={"min": 0},
                 overrides=(limit_style, *overrides))


def line_graph(title: str, description: str, targets: Sequence[Target], unit: str, width: int,
               height: int) -> Panel:
    """A graph of a rate or gauge that only shows, from 0: straight lines, a list legend, no thresholds."""
    return Panel("timeseries", title, description, targets, unit, green_only(), width, height,
                 options=LEGEND_LIST, custom={"lineInterpolation": "linear"}, defaults={"min": 0})


def boot_count_graph(title: str, description: str, target: Target | tuple[Target, ...],
                     colour_from_one: str | None = None) -> Panel:
    """Counters of this boot's events, in whole numbers from 0; with `colour_from_one`, a threshold line
    at 1 in that colour: any such event is worth a look."""
    thresholds = [(None, "green"), (1, colour_from_one)] if colour_from_one else green_only()
    custom = {"thresholdsStyle": {"mode": "line"}} if colour_from_one else {}
    targets = target if isinstance(target, tuple) else (target,)
    return Panel("timeseries", title, description, targets, "short", thresholds, 8, 8, options=LEGEND_LIST,
                 custom=custom, defaults={"min": 0, "decimals": 0})


def rows() -> tuple[Row, ...]:
    """The panels, with the thresholds and durations of the alerts they show as the rules' knobs."""
    headroom_threshold = knob("restartHeadroomThresholdBytes", "number")
    headroom_thresholds = [(None, "red"), (headroom_threshold, "green")]
    reserve = knob("unitsDoNotFitReserveBytes")
    return (
        Row("Device memory", (
            stacked_against("Device memory by unit",
                            "Device memory each systemd unit or container holds (containers by name: docker/<name>, "
                            "podman/<name>, k8s/<namespace>/<pod>/<container>), stacked with the used memory no "
                            "process accounts for, against the device's total.",
                            (Target(f"xpu_unit_memory_bytes{{{DEVICE}}}", "{{unit}}"),
                             Target(f"xpu_unattributed_memory_bytes{{{DEVICE}}}", "unattributed"),
                             Target(f"xpu_memory_total_bytes{{{DEVICE}}}", "total")),
                            "total", (by_name_regex("^unattributed$", {"color": fixed_colour("#8e8e8e")}),)),
            Panel("stat", "Free device memory",
                  "Free device memory as a fraction of the total. The XpuMemoryNearlyFull alert fires below "
                  f"{knob('memoryNearlyFullFreeRatio', 'percent')} for {knob('memoryNearlyFullFor', 'words')}.",
                  (Target(f"xpu_memory_free_bytes{{{DEVICE}}} / xpu_memory_total_bytes{{{DEVICE}}}"),),
                  # orange from the alert's threshold up to twice it: close to firing
                  "percentunit", [(None, "red"), (knob("memoryNearlyFullFreeRatio", "number"), "orange"),
                                  (knob("memoryNearlyFullFreeRatio", "doubledRatio"), "green")], 4, 4,
                  options=STAT_OPTIONS, defaults={"decimals": 1}),
            Panel("stat", "Memory accounting",
                  "Whether the driver reports real usage. Untrusted: without CAP_PERFMON i915/xe report free == "
                  "total, so free, used, unattributed memory and restart headroom are wrong.",
                  (Target(f"xpu_memory_accounting_trusted{{{DEVICE}}}"),),
                  "none", [(None, "red"), (1, "green")], 4, 4,
                  options=STAT_OPTIONS,
                  defaults={"mappings": value_mapping({0: ("untrusted", "red"), 1: ("trusted", "green")})}),
            Panel("stat", "Unattributed memory",
                  "Used device memory held by no process the exporter sees, as a fraction of the total. "
                  f"The XpuUnattributedMemoryHigh alert fires above {knob('unattributedMemoryRatio', 'percent')} "
                  f"for {knob('unattributedMemoryFor', 'words')}.",
                  (Target(f"xpu_unattributed_memory_bytes{{{DEVICE}}} / xpu_memory_total_bytes{{{DEVICE}}}"),),
                  "percentunit", [(None, "green"), (knob("unattributedMemoryRatio", "number"), "orange")], 4, 4,
                  options=STAT_OPTIONS, defaults={"decimals": 1}),
            Panel("stat", "GPU",
                  "The device's name and driver version, as Level Zero reports them.",
                  (Target(f"xpu_device_info{{{DEVICE}}}", "{{name}} (driver {{driver_version}})"),),
                  "none", [(None, "blue")], 4, 4,
                  options={**STAT_OPTIONS, "textMode": "name", "colorMode": "none"}),
        )),
        Row("Device telemetry", (
            Panel("timeseries", "Engine busy by group",
                  "Fraction of time each engine group of the device was busy (rate of "
                  "xpu_engine_active_seconds_total). The groups overlap: all covers every engine, 3d_render_compute "
                  "covers render and compute. Needs CAP_SYS_ADMIN (or root): without it the panel is empty.",
                  (Target(f"rate(xpu_engine_active_seconds_total{{{DEVICE}}}[$__rate_interval])", "{{engine}}"),),
                  "percentunit", green_only(), 12, 8, options=LEGEND_TABLE,
                  custom={"lineInterpolation": "linear"}, defaults={"min": 0, "max": 1}),
            line_graph("Power",
                       "The card's power draw (the package's where the driver has no card power domain): the rate "
                       "of xpu_energy_joules_total. Some drivers serve it to root only.",
                       (Target(f"rate(xpu_energy_joules_total{{{DEVICE}}}[$__rate_interval])", "power"),),
                       "watt", 6, 8),
            Panel("timeseries", "Temperature",
                  "Temperature per sensor (global, gpu, memory: those the driver has; some drivers serve them to "
                  "root only). XpuDeviceTemperatureHigh fires when a sensor the rules compare "
                  f"({knob('temperatureSensorSelector')}) stays above {knob('temperatureHighCelsius', 'number')} °C "
                  f"for {knob('temperatureHighFor', 'words')} (red line).",
                  (Target(f"xpu_temperature_celsius{{{DEVICE}}}", "{{sensor}}"),),
                  "celsius", [(None, "green"), (knob("temperatureHighCelsius", "number"), "red")], 6, 8,
                  options=LEGEND_LIST, custom={"thresholdsStyle": {"mode": "line"}, "lineInterpolation": "linear"}),
            line_graph("Frequency",
                       "Actual frequency of each frequency domain (gpu, memory, media); the throttle reasons panel "
                       "says what holds it down.",
                       (Target(f"xpu_frequency_hertz{{{DEVICE}}}", "{{domain}}"),),
                       "hertz", 8, 8),
            Panel("state-timeline", "Throttle reasons",
                  "The reasons the driver holds each frequency domain down for, while it does; empty: no throttling "
                  f"in the time range. Red: the reasons XpuDeviceThrottled fires for after "
                  f"{knob('deviceThrottledFor', 'words')} ({knob('deviceThrottledReasons', 'list')}). "
                  "Orange: the others, e.g. the power and current limits a busy GPU reaches by design "
                  "(average_power, burst_power, current) or a lower frequency range (software_range, hardware_range).",
                  (Target(f"xpu_frequency_throttled{{{DEVICE}}} == 1", "{{domain}} {{reason}}"),),
                  "none", [(None, "orange")], 8, 8, options=STATE_TIMELINE_OPTIONS,
                  custom={"fillOpacity": 80, "lineWidth": 0},
                  defaults={"mappings": value_mapping({1: ("throttled", "orange")})},
                  overrides=(by_name_regex(f" ({knob('deviceThrottledReasons')})$",
                                           {"mappings": value_mapping({1: ("throttled", "red")})}),)),
            line_graph("Memory bandwidth",
                       "Bytes per second read from and written to the device's local memory (rates of "
                       "xpu_memory_read_bytes_total and xpu_memory_write_bytes_total).",
                       (Target(f"rate(xpu_memory_read_bytes_total{{{DEVICE}}}[$__rate_interval])", "read"),
                        Target(f"rate(xpu_memory_write_bytes_total{{{DEVICE}}}[$__rate_interval])", "write")),
                       "Bps", 8, 8),
            Panel("timeseries", "RAS errors",
                  "Hardware errors the device counted, per severity and category, in each interval. "
                  "XpuDeviceUncorrectableErrors fires on any uncorrectable one and stays for "
                  f"{knob('deviceUncorrectableErrorsWindow', 'words')}. Reading RAS counters needs root: "
                  "without it the panel is empty.",
                  (Target(f"sum by (severity, category) (increase(xpu_ras_errors_total{{{DEVICE}}}[$__rate_interval]))",
                          "{{severity}} {{category}}"),),
                  "short", green_only(), 16, 8, options=LEGEND_TABLE,
                  custom={"drawStyle": "bars", "fillOpacity": 80}, defaults={"min": 0},
                  overrides=(by_name_regex("^uncorrectable ", {"color": fixed_colour("red")}),
                             by_name_regex("^correctable ", {"color": fixed_colour("orange")}))),
            Panel("stat", "RAS errors since the driver loaded",
                  "Hardware errors the device counted since its driver loaded, per severity (also those from "
                  "before Prometheus first scraped it, which no alert reports). Needs root.",
                  (Target(f"sum by (severity) (xpu_ras_errors_total{{{DEVICE}}})", "{{severity}}"),),
                  "short", [(None, "green"), (1, "orange")], 8, 4,
                  options={**STAT_OPTIONS, "textMode": "value_and_name"}, defaults={"decimals": 0},
                  overrides=(by_name("uncorrectable",
                                     {"thresholds": thresholds_json([(None, "green"), (1, "red")])}),)),
            Panel("stat", "Memory health",
                  "The device memory's health as the driver reports it: ok; degraded (too many correctable errors, "
                  "reset the device); critical (memory banks left out); replace. unknown: the driver does not report "
                  "it, as upstream i915 and xe mostly do not. XpuMemoryUnhealthy fires on degraded, critical or "
                  f"replace after {knob('memoryUnhealthyFor', 'words')}.",
                  (Target(f"xpu_memory_health{{{DEVICE}}} == 1", "{{state}}"),),
                  "none", [(None, "blue")], 8, 4,
                  options={**STAT_OPTIONS, "textMode": "name"},
                  overrides=tuple(by_name(state, {"color": fixed_colour(colour)})
                                  for state, colour in (("ok", "green"), ("unknown", "blue"), ("degraded", "orange"),
                                                        ("critical", "red"), ("replace", "red")))),
            Panel("timeseries", "Engine busy by unit",
                  "Fraction of time each systemd unit or container kept each engine of the device busy (recording rule "
                  "unit:xpu_unit_engine_busy:ratio, from the DRM fdinfo of the unit's processes: busy time on i915, "
                  "cycles per GPU cycle on xe), stacked per engine: a stack is the engine's busy share of the units. "
                  "The engine names are the kernel's keys (render, copy, video, video-enhance, compute on i915; "
                  "rcs, bcs, vcs, vecs, ccs on xe). When a process of a unit exits, the unit's counters drop and "
                  "the next minutes read too high. Needs the exporter to read other users' fdinfo (CAP_SYS_PTRACE).",
                  (Target(f"unit:xpu_unit_engine_busy:ratio{{{DEVICE},unit=~\"$unit\"}}", "{{unit}} {{engine}}"),),
                  "percentunit", green_only(), 24, 8, options=LEGEND_TABLE,
                  custom={"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 40,
                          "lineInterpolation": "linear"},
                  defaults={"min": 0},
                  overrides=tuple(by_name_regex(f" {engine}$", {"custom.stacking": {"mode": "normal", "group": engine}})
                                  for engine in UNIT_ENGINE_KEYS)),
        )),
        Row("KV cache per unit", (
            Panel("timeseries", "KV cache against the need of one max-length request",
                  "KV-cache memory of each unit's latest engine start (for a failed start, what was available), "
                  "and the memory one request of the maximum model length needs (dashed).",
                  (Target(f"xpu_unit_kv_cache_bytes{{{UNITS}}}", "{{unit}} KV cache"),
                   Target(f"xpu_unit_kv_cache_required_bytes{{{UNITS}}}",
                          "{{unit}} needed for one max-length request")),
                  "bytes", green_only(), 12, 8,
                  options=LEGEND_TABLE, defaults={"min": 0},
                  overrides=(dashed("needed for one"),)),
            Panel("bargauge", "Max-length requests that fit",
                  "Requests of the maximum model length the latest start's KV cache holds at once. Below 1 the "
                  "engine cannot serve one (XpuUnitKvCacheTooSmall); below max_num_seqs long requests get "
                  "preempted (XpuUnitKvCacheBelowMaxNumSeqs).",
                  (Target(MAX_LENGTH_REQUESTS, "{{unit}}", instant=True),),
                  "none", [(None, "red"), (1, "green")], 6, 8,
                  options=BARGAUGE_OPTIONS, defaults={"min": 0, "decimals": 2}),
            Panel("table", "Engine of the latest start",
                  "Per unit: vLLM version, model and the settings of its latest engine start, and the KV-cache "
                  "tokens of its latest successful start.",
                  (Target(f"max by (unit, vllm_version, model) (xpu_unit_engine_info{{{UNITS}}})",
                          instant=True, table=True),
                   Target(f"max by (unit) (xpu_unit_gpu_memory_utilization_ratio{{{UNITS}}})",
                          instant=True, table=True),
                   Target(f"max by (unit) (xpu_unit_max_model_len_tokens{{{UNITS}}})", instant=True, table=True),
                   Target(f"max by (unit) (xpu_unit_max_num_seqs{{{UNITS}}})", instant=True, table=True),
                   Target(f"max by (unit) (xpu_unit_kv_cache_tokens{{{UNITS}}})", instant=True, table=True)),
                  "none", green_only(), 6, 8,
                  options={"showHeader": True, "cellHeight": "sm"},
                  overrides=(by_name("gpu_memory_utilization", {"unit": "percentunit"}),
                             by_name("max_model_len", {"unit": "short"}),
                             by_name("KV cache tokens", {"unit": "short"})),
                  # one row per unit: the queries share only `unit` (and the evaluation time)
                  transformations=(
                      {"id": "merge", "options": {}},
                      {"id": "organize", "options": {
                          "excludeByName": {"Time": True, "Value #A": True},
                          "renameByName": {"vllm_version": "vLLM", "Value #B": "gpu_memory_utilization",
                                           "Value #C": "max_model_len", "Value #D": "max_num_seqs",
                                           "Value #E": "KV cache tokens"}}},
                  )),
            Panel("timeseries", "Maximum model length: asked for and served",
                  "The maximum model length of each unit's latest engine start: the one it asked for (dashed; the "
                  "model's full length under --max-model-len auto) and the one it serves. Served below asked: "
                  "auto-fit shrank the context to the KV-cache memory it found at init (XpuUnitContextShrunk), "
                  "and longer requests are rejected.",
                  (Target(f"xpu_unit_max_model_len_requested_tokens{{{UNITS}}}", "{{unit}} asked for"),
                   Target(f"xpu_unit_max_model_len_tokens{{{UNITS}}}", "{{unit}} served")),
                  "short", green_only(), 24, 8,
                  options=LEGEND_TABLE, defaults={"min": 0},
                  overrides=(dashed("asked for$"),)),
        )),
        Row("Engine inits", (
            boot_count_graph("Successful engine starts (this boot)",
                             "Engine inits that succeeded since the host booted, per unit, read from the journal. "
                             "Failed inits are marked on every graph (annotation \"Engine init failures\").",
                             Target(f"xpu_unit_engine_starts_total{{{UNITS}}}", "{{unit}}")),
            boot_count_graph("Engine init failures by reason (this boot)",
                             "Engine inits that failed since the host booted, per unit and reason (kv_cache_too_small, "
                             "no_kv_cache_memory, insufficient_free_memory, device_out_of_memory, "
                             "memory_query_unsupported, other). Only units and reasons with failures are shown.",
                             Target(f"sum by (unit, reason) (xpu_unit_engine_init_failures_total{{{UNITS}}}) > 0",
                                    "{{unit}} {{reason}}"),
                             colour_from_one="red"),
            boot_count_graph("Overlapping engine inits (this boot)",
                             "Inits of each unit that ran while another unit was initialising on the same host: the "
                             "boot race. The unit that initialises last sees memory the others are about to take.",
                             Target(f"xpu_unit_engine_init_overlaps_total{{{UNITS}}}", "{{unit}}"),
                             colour_from_one="orange"),
            boot_count_graph("Starts held back by the init gate (this boot)",
                             "Starts of each unit that the init gate (vllm-xpu-gate, an ExecStartPre= command) made "
                             "wait for another unit's init or for free memory, timeouts included. Gated units' inits "
                             "should not overlap.",
                             Target(f"xpu_unit_gate_waits_total{{{UNITS}}}", "{{unit}}")),
            Panel("timeseries", "Time spent in the init gate (this boot)",
                  "Seconds each unit's starts spent in the init gate since the host booted.",
                  (Target(f"xpu_unit_gate_wait_seconds_total{{{UNITS}}}", "{{unit}}"),),
                  "s", green_only(), 8, 8, options=LEGEND_LIST, defaults={"min": 0}),
            boot_count_graph("Init gate timeouts and ungated starts (this boot)",
                             "Waits in the init gate that ran out (its --timeout): the unit then started anyway (or "
                             "failed, with --on-timeout fail) while another init ran or memory was short. Ungated: "
                             "starts whose gate client found no gate service to ask (or may not use AF_UNIX) and "
                             "let the unit start without a decision.",
                             (Target(f"xpu_unit_gate_timeouts_total{{{UNITS}}}", "{{unit}} timed out"),
                              Target(f"xpu_unit_gate_ungated_starts_total{{{UNITS}}}", "{{unit}} ungated")),
                             colour_from_one="orange"),
            boot_count_graph("Context shrinks (this boot)",
                             "Starts of each unit whose --max-model-len auto served a shorter context than the "
                             "model's full length since the host booted: the start succeeded, with too little "
                             "KV-cache memory at init (often a lost race with another unit's init).",
                             Target(f"xpu_unit_context_shrinks_total{{{UNITS}}}", "{{unit}}"),
                             colour_from_one="orange"),
        )),
        Row("Restart headroom", (
            Panel("timeseries", "Restart headroom",
                  "Free memory plus the unit's own, less what its gpu_memory_utilization demands at start "
                  "(vLLM 0.16 and later refuse to start without it). Below 0 a restart now would fail; "
                  "XpuUnitRestartHeadroomNegative fires below "
                  f"{knob('restartHeadroomThresholdBytes', 'bytes')} for "
                  f"{knob('restartHeadroomFor', 'words')} (red).",
                  (Target(f"xpu_unit_restart_headroom_bytes{{{UNITS}}}", "{{unit}} on {{device}}"),),
                  "bytes", headroom_thresholds, 16, 8,
                  options=LEGEND_TABLE,
                  custom={"thresholdsStyle": {"mode": "line+area"}, "fillOpacity": 0}),
            Panel("bargauge", "Restart headroom now",
                  "Each unit's restart headroom at the end of the time range; red: below "
                  f"{knob('restartHeadroomThresholdBytes', 'bytes')}, where "
                  "XpuUnitRestartHeadroomNegative fires.",
                  (Target(f"xpu_unit_restart_headroom_bytes{{{UNITS}}}", "{{unit}}", instant=True),),
                  "bytes", headroom_thresholds, 8, 8,
                  options=BARGAUGE_OPTIONS),
        )),
        Row("Plan", (
            stacked_against("Units' footprints against the GPU",
                            "What each engine unit holds serving its target (weights, peak activation, non-torch "
                            "memory and the KV cache the target needs; vllm-xpu-plan's figures), stacked, against the "
                            f"GPU's total less {knob('unitsDoNotFitReserveBytes', 'bytes')} for the driver (dashed). "
                            "Above it, the units "
                            "cannot all run at once: XpuDeviceUnitsDoNotFit fires after "
                            f"{knob('unitsDoNotFitFor', 'words')}. A unit's target is what its "
                            "--kv-cache-memory-bytes holds, else the KV of its last successful start.",
                            (Target(f"xpu_unit_memory_footprint_bytes{{{DEVICE}}}", "{{unit}}"),
                             Target(f"xpu_memory_total_bytes{{{DEVICE}}} - {reserve}", "usable")),
                            "usable"),
            Panel("bargauge", "Room left after the units' targets",
                  "The GPU's total less the driver's share and the units' footprints: below 0 (red), they do not "
                  "all fit; run vllm-xpu-plan for the --kv-cache-memory-bytes that do.",
                  (Target(f"xpu_memory_total_bytes{{{DEVICE}}} - {reserve} - xpu_device_units_footprint_bytes{{{DEVICE}}}",
                          "{{device}}", instant=True),),
                  "bytes", [(None, "red"), (0, "green")], 8, 8,
                  options=BARGAUGE_OPTIONS),
            Panel("timeseries", "Planned and actual KV cache",
                  "Per unit, the KV cache its target needs (dashed), the budget vllm-xpu-plan's drop-in gives it "
                  "(plan written, dashed) and the one its latest start got. Actual below planned: the unit serves "
                  "fewer full-length requests at once than its target; a plan written that the unit does not run "
                  "with: XpuUnitPlanNotApplied.",
                  (Target(f'xpu_unit_kv_cache_planned_bytes{{{DEVICE},unit=~"$unit"}}', "{{unit}} planned"),
                   Target(f'xpu_unit_kv_cache_plan_bytes{{{DEVICE},unit=~"$unit"}}', "{{unit}} plan written"),
                   Target(f"xpu_unit_kv_cache_bytes{{{UNITS}}}", "{{unit}} actual")),
                  "bytes", green_only(), 24, 8,
                  options=LEGEND_TABLE, defaults={"min": 0},
                  overrides=(dashed("(planned|plan written)$"),)),
        )),
        Row("KV in use", (
            Panel("timeseries", "KV in use, planned and allocated",
                  "Per unit, the KV-cache bytes its requests hold now (vLLM's usage times the unit's KV bytes: the "
                  "recording rule unit:vllm_kv_cache_used:bytes over vLLM's own series, scraped through /sd/vllm), "
                  "the KV its target needs (planned, dashed) and the KV its latest start got (allocated, dotted). "
                  "In use near allocated with preemptions: too small (XpuUnitKvCacheTooSmallForLoad); far below "
                  "allocated for long: oversized (XpuUnitKvCacheOversized).",
                  (Target(f"unit:vllm_kv_cache_used:bytes{{{VLLM_UNITS}}}", "{{unit}} in use"),
                   Target(f'xpu_unit_kv_cache_planned_bytes{{{DEVICE},unit=~"$unit"}}', "{{unit}} planned"),
                   Target(f"xpu_unit_kv_cache_bytes{{{UNITS}}}", "{{unit}} allocated")),
                  "bytes", green_only(), 24, 8,
                  options=LEGEND_TABLE, defaults={"min": 0},
                  overrides=(dashed("planned$"),)),
            Panel("timeseries", "KV-cache usage",
                  "vLLM's KV-cache usage per unit (kv_cache_usage_perc, gpu_cache_usage_perc before 0.11): the "
                  "blocks running requests hold; blocks kept only for the prefix cache count as free.",
                  (Target(f"unit:vllm_kv_cache_usage:ratio{{{VLLM_UNITS}}}", "{{unit}}"),),
                  "percentunit", [(None, "green"), (0.9, "orange"), (1, "red")], 8, 8,
                  defaults={"min": 0, "max": 1}),
            Panel("timeseries", "Preemptions and requests waiting for capacity",
                  "Per unit, preemptions per second and requests waiting for KV capacity (every waiting request "
                  "before vLLM's waiting reasons), against those running. Either while fewer than max_num_seqs "
                  "run: the KV cache is the limit.",
                  (Target(f"unit:vllm_preemptions:rate5m{{{VLLM_UNITS}}}", "{{unit}} preemptions/s"),
                   Target(f"unit:vllm_requests_waiting_for_capacity:sum{{{VLLM_UNITS}}}", "{{unit}} waiting for capacity"),
                   Target(f"unit:vllm_requests_running:sum{{{VLLM_UNITS}}}", "{{unit}} running")),
                  "short", green_only(), 16, 8,
                  options=LEGEND_TABLE, defaults={"min": 0}),
        )),
        Row("Exporter", (
            Panel("stat", "Exporter up",
                  "Whether Prometheus scrapes the exporter (XpuExporterDown fires after "
                  f"{knob('exporterDownFor', 'words')} down).",
                  (Target(f"up{{{EXPORTER}}}"),),
                  "none", [(None, "red"), (1, "green")], 3, 6, options=STAT_OPTIONS,
                  defaults={"mappings": value_mapping({0: ("down", "red"), 1: ("up", "green")})}),
            Panel("stat", "Exporter version",
                  "The exporter's version.",
                  (Target(f"xpu_exporter_build_info{{{EXPORTER}}}", "{{version}}"),),
                  "none", [(None, "blue")], 3, 3, options={**STAT_OPTIONS, "textMode": "name", "colorMode": "none"}),
            Panel("stat", "Units watched",
                  "vLLM units the journal collector watches (their names match --journal.units). 0: the globs "
                  "match no unit in the journal it reads (XpuExporterNoUnitsWatched fires after "
                  f"{knob('noUnitsWatchedFor', 'words')}). "
                  "No value: the journal collector is off or failing.",
                  (Target(f"xpu_exporter_journal_units_watched{{{EXPORTER}}}"),),
                  "none", [(None, "orange"), (1, "green")], 3, 3, options=STAT_OPTIONS, defaults={"decimals": 0}),
            Panel("stat", "Collector success",
                  "Whether each collector's last run worked (XpuExporterCollectorFailing fires after "
                  f"{knob('collectorFailingFor', 'words')} of failure); the exporter's log says why one fails.",
                  (Target(f"xpu_exporter_collector_success{{{EXPORTER}}}", "{{collector}}"),),
                  "none", [(None, "red"), (1, "green")], 6, 6,
                  options={**STAT_OPTIONS, "textMode": "value_and_name"},
                  defaults={"mappings": value_mapping({0: ("failing", "red"), 1: ("ok", "green")})}),
            Panel("timeseries", "Collector duration",
                  "How long each collector's last run took. Level Zero reads are abandoned after "
                  "--levelzero.timeout (4 s); Prometheus gives up a scrape after its scrape timeout (10 s).",
                  (Target(f"xpu_exporter_collector_duration_seconds{{{EXPORTER}}}", "{{collector}}"),),
                  "s", [(None, "green"), (4, "orange"), (10, "red")], 6, 6, options=LEGEND_LIST,
                  custom={"thresholdsStyle": {"mode": "dashed"}, "lineInterpolation": "linear"}, defaults={"min": 0}),
            line_graph("Journal entries read",
                       "Journal entries of watched units the exporter reads per second: a burst while it catches "
                       "up on the boot, then the units' new output.",
                       (Target(f"rate(xpu_exporter_journal_entries_read_total{{{EXPORTER}}}[$__rate_interval])",
                               "entries read"),),
                       "cps", 6, 6),
        )),
    )

FAILURE_ANNOTATION: Json = {
    "name": "Engine init failures",
    "datasource": DATASOURCE,
    "enable": True,
    "iconColor": "red",
    # The value is the failure's own time: each failure is marked when it happened, also the first one
    # and those that happened before Prometheus first scraped the exporter.
    "expr": f"xpu_unit_engine_last_failure_timestamp_seconds{{{UNITS}}} * 1000",
    "useValueForTime": True,
    "step": "60s",
    "titleFormat": "Engine init failed: {{unit}}",
    "textFormat": "{{unit}} failed to initialise its vLLM engine (see the failures-by-reason panel)",
    "tagKeys": "unit",
}


def variable(name: str, label: str, query: str, *, multi: bool = False, include_all: bool | None = None) -> Json:
    """A label_values() variable; with All (`include_all`, as `multi` by default) matching every value, and
    no value: a dashboard of series without the label (one cluster) shows them under All."""
    include_all = multi if include_all is None else include_all
    return {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        "definition": query, "query": {"query": query, "refId": f"{name}-values"},
        "refresh": 2, "sort": 1, "multi": multi, "includeAll": include_all, "hide": 0, "regex": "",
        "current": {}, **({"allValue": ".*"} if include_all and not multi else {}),
    }


DATASOURCE_VARIABLE: Json = {
    "name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
    "current": {"selected": True, "text": "${DS_PROMETHEUS}", "value": "${DS_PROMETHEUS}"},
    "hide": 0, "refresh": 1, "regex": "", "multi": False, "includeAll": False}


def variables() -> list[Json]:
    """Data source, cluster, job, instance, GPU and units: each chosen among the exporters the rules'
    `selector` takes, within the ones before it."""
    exporters = "xpu_exporter_build_info{${selector}"
    in_cluster = f'{exporters},${{clusterLabel}}=~"$cluster"'
    return [
        DATASOURCE_VARIABLE,
        variable("cluster", "Cluster", f"label_values({exporters}}}, ${{clusterLabel}})", include_all=True),
        variable("job", "Job", f"label_values({in_cluster}}}, job)", include_all=True),
        variable("instance", "Instance", f'label_values({in_cluster},job=~"$job"}}, instance)'),
        variable("device", "GPU", f"label_values(xpu_memory_total_bytes{{{SCOPE}}}, device)"),
        # The units the journal watches (running or not) and the containers holding the GPU (by name;
        # kind!="systemd" leaves out the desktop sessions and other units that only hold memory)
        variable("unit", "Unit", 'label_values({__name__=~"xpu_unit_engine_starts_total|xpu_workload_info",'
                                 f'kind!="systemd",{SCOPE}}}, unit)', multi=True),
    ]


def target_json(target: Target, ref_id: str) -> Json:
    return {"datasource": DATASOURCE, "refId": ref_id, "expr": target.expr, "legendFormat": target.legend,
            "range": not target.instant, "instant": target.instant, "editorMode": "code",
            "format": "table" if target.table else "time_series"}


def panel_json(panel: Panel, panel_id: int, x: int, y: int) -> Json:
    custom = {**TIMESERIES_CUSTOM, **panel.custom} if panel.kind == "timeseries" else dict(panel.custom)
    return {
        "id": panel_id, "type": panel.kind, "title": panel.title, "description": panel.description,
        "datasource": DATASOURCE, "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "targets": [target_json(target, chr(ord("A") + index)) for index, target in enumerate(panel.targets)],
        "fieldConfig": {
            "defaults": {"unit": panel.unit, "color": {"mode": "palette-classic" if panel.kind == "timeseries"
                                                        else "thresholds"},
                         "thresholds": thresholds_json(panel.thresholds), "custom": custom, **panel.defaults},
            "overrides": list(panel.overrides),
        },
        "options": dict(panel.options),
        "transformations": list(panel.transformations),
    }


def layout(rows: Sequence[Row]) -> list[Json]:
    """Rows and their panels on Grafana's 24-column grid: panels fill a line left to right; a panel
    half as high as the line's first one stacks under its left neighbour of the same size."""
    panels: list[Json] = []
    y = 0
    next_id = 1
    for row in rows:
        panels.append({"id": next_id, "type": "row", "title": row.title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y}})
        next_id += 1
        y += 1
        x, line_height, stack_bottom = 0, 0, None
        for panel in row.panels:
            if line_height and panel.height * 2 == line_height and stack_bottom is not None \
                    and stack_bottom[1] == panel.width:
                # second half-height panel: under the previous one
                panels.append(panel_json(panel, next_id, stack_bottom[0], y + panel.height))
                stack_bottom = None
            else:
                if x + panel.width > GRID_WIDTH:
                    y, x, line_height = y + line_height, 0, 0
                panels.append(panel_json(panel, next_id, x, y))
                if line_height and panel.height * 2 == line_height:
                    stack_bottom = (x, panel.width)
                else:
                    stack_bottom = None
                line_height = max(line_height, panel.height)
                x += panel.width
            next_id += 1
        y += line_height
    return panels


def dashboard() -> Json:
    """The mixin's dashboard template (mixin/dashboard.json): the rules' knobs (selectors, cluster label,
    the thresholds and durations of the alerts) are placeholders the mixin fills in from its config."""
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "description": "Prometheus that scrapes "
                      "vllm-xpu-exporter", "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
            {"type": "panel", "id": "stat", "name": "Stat", "version": ""},
            {"type": "panel", "id": "bargauge", "name": "Bar gauge", "version": ""},
            {"type": "panel", "id": "table", "name": "Table", "version": ""},
            {"type": "panel", "id": "state-timeline", "name": "State timeline", "version": ""},
        ],
        "uid": "vllm-xpu-exporter",
        "title": "Intel XPU memory and vLLM units",
        "description": "Device memory per systemd unit or container, device telemetry, vLLM KV cache, engine-init "
                       "failures and restart headroom on Intel GPUs, from vllm-xpu-exporter.",
        "tags": ["xpu", "intel-gpu", "vllm", "vllm-xpu-exporter"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 38,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "links": [],
        "annotations": {"list": [FAILURE_ANNOTATION]},
        "templating": {"list": variables()},
        "panels": layout(rows()),
    }


def as_file(node: Json) -> str:
    """A dashboard as the repository's files hold it: two-space JSON, numbers at their shortest (jsonnet's
    C++ evaluator writes 0.05 as 0.050000000000000003)."""
    return json.dumps(node, indent=2) + "\n"


def render(overrides: Mapping[str, str] = ()) -> str:
    """The dashboard's JSON for these knob overrides: the mixin's."""
    return as_file(json.loads(evaluate(MIXIN / "dashboard.jsonnet", overrides=knob_values(overrides))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the file instead of writing it")
    parser.add_argument("--values", action="append", default=[], type=Path,
                        help="YAML file of the rules' knob values, as for rules/render.py (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", dest="assignments",
                        help="one knob value, as for rules/render.py (repeatable)")
    parser.add_argument("-o", "--output", type=Path,
                        help=f"write here (default: {OUTPUT.name} without knob values, else standard output)")
    args = parser.parse_args(argv)
    try:
        overrides: dict[str, str] = {}
        for path in args.values:
            overrides.update(load_values(path))
        overrides.update(parse_assignments(args.assignments))
        text = render(overrides)
    except (RenderError, OSError, ValueError) as error:
        print(f"dashboard.py: {error}", file=sys.stderr)
        return 2
    # Without knob values, the mixin's template too: its dashboard is the shipped one.
    written = {} if overrides else {TEMPLATE: as_file(dashboard())}
    if args.check:
        stale = [path for path, content in {**written, OUTPUT: text}.items()
                 if not path.is_file() or path.read_text() != content]
        for path in stale:
            print(f"{path} is not what grafana/dashboard.py builds; run python3 grafana/dashboard.py",
                  file=sys.stderr)
        return 1 if stale else 0
    for path, content in written.items():
        path.write_text(content)
    if args.output or not overrides:
        (args.output or OUTPUT).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
