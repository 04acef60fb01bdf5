"""Engine starts, failures and KV cache of the watched units and containers, from their journal and, with
--logs.docker, --logs.podman or --logs.pods, their containers' log files: the followers' states
(vllm_xpu_exporter.sources.logs.follower) as metric families, one set for both sources."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from vllm_xpu_exporter.collector import CollectionError, Collector, ScrapeContext, Source, Sources, register
from vllm_xpu_exporter.families import CounterFamily, GaugeFamily
from vllm_xpu_exporter.fold.engine_starts import UnitView
from vllm_xpu_exporter.sources.journal.trust import REJECTION_REASONS
from vllm_xpu_exporter.nodatayet import NoDataYet
from vllm_xpu_exporter.sources.logs.follower import LogState
from vllm_xpu_exporter.parsers.vllm import FailureReason, StartupPlanOutcome


class JournalCollector(Collector):
    name = "journal"

    def collect(self, context: ScrapeContext) -> Iterator[Metric]:
        state = context.journal_state()
        if state is None:
            raise CollectionError("the journal is not read")
        logs = context.container_logs_state()
        states = [state] if logs is None else [state, logs]
        yield CounterFamily("xpu_exporter_journal_entries_read_total",
                            "Journal entries of watched units the exporter has read.", value=state.entries_read)
        yield CounterFamily("xpu_exporter_journal_units_dropped_total",
                            "Units and containers matching --journal.units and --journal.containers that are not "
                            "watched because of --journal.max-units.", value=sum(s.dropped_units for s in states))
        if all(s.watched_units is not None for s in states):  # unknown before the first read: 0 would say the
            yield GaugeFamily("xpu_exporter_journal_units_watched",  # globs match nothing
                              "Units and containers matching --journal.units and --journal.containers seen in the "
                              "selected boot's journal, the containers' logs or with GPU processes now, at most "
                              "--journal.max-units (a bound per source, owner and kind: units, containers); 0: "
                              "the globs match nothing.",
                              value=sum(s.watched_units or 0 for s in states))
        yield CounterFamily("xpu_exporter_journal_values_rejected_total",
                            "Lines of watched units ignored because a value in them is out of range or "
                            "not a number.", value=sum(s.values_rejected for s in states))
        rejected = CounterFamily("xpu_exporter_journal_entries_rejected_total",
                                 "Journal entries naming a watched container that its engine did not write "
                                 "(reason container_sender: not dockerd in docker.service nor conmon; "
                                 "podman_event: a died event not written by podman), ignored.", labels=["reason"])
        for reason in REJECTION_REASONS:
            rejected.add_metric([reason], state.rejected.get(reason, 0))
        yield rejected
        yield CounterFamily("xpu_exporter_container_log_lines_read_total",
                            "Records of watched containers' log files the exporter has read (--logs.docker, "
                            "--logs.podman, --logs.pods).", value=logs.entries_read if logs is not None else 0)
        yield CounterFamily("xpu_exporter_container_log_lines_rejected_total",
                            "Lines of watched containers' log files skipped: not a record of their file's format, "
                            "or too long.", value=logs.unreadable if logs is not None else 0)
        yield from unit_metrics(context.engine_views())
        error = collection_error(states)
        if error is not None:
            raise error


@register("journal", "vLLM engine starts, failures and KV cache from the journal", needs=[Source.JOURNAL])
def _journal_collector(options: None, sources: Sources) -> JournalCollector:
    return JournalCollector()


def collection_error(states: list[LogState]) -> CollectionError | NoDataYet | None:
    """What the collector raises when its sources cannot be read now: their failures, else that one is still
    being read (a NoDataYet of its own: the state's would gather a traceback at each raise); None when all
    work."""
    errors = [state.error for state in states if state.error is not None]
    failures = [str(error) for error in errors if not isinstance(error, NoDataYet)]
    if failures:
        return CollectionError("; ".join(failures))
    return NoDataYet(str(errors[0])) if errors else None


def unit_metrics(views: list[UnitView]) -> Iterator[Metric]:
    def gauge(name: str, documentation: str, extra_labels: tuple[str, ...] = ()) -> GaugeFamily:
        return GaugeFamily(name, documentation, labels=["unit", *extra_labels])

    info = gauge("xpu_unit_engine_info", "The unit's latest engine start: vLLM version and model.",
                 ("vllm_version", "model"))
    utilisation = gauge("xpu_unit_gpu_memory_utilization_ratio",
                        "The engine's gpu_memory_utilization (its release's default when not given).")
    max_model_len = gauge("xpu_unit_max_model_len_tokens",
                          "The engine's maximum model length (after --max-model-len auto fitted it).")
    requested_len = gauge("xpu_unit_max_model_len_requested_tokens",
                          "The maximum model length the engine asked for: the model's full length when "
                          "--max-model-len auto fitted it, else the length it printed.")
    max_num_seqs = gauge("xpu_unit_max_num_seqs", "The engine's max_num_seqs, when known.")
    budget = gauge("xpu_unit_kv_cache_budget_bytes", "The engine's kv_cache_memory_bytes setting, when set.")
    kv_bytes = gauge("xpu_unit_kv_cache_bytes",
                     "KV-cache memory of the latest engine init (for a failed init, what was available).")
    kv_tokens = gauge("xpu_unit_kv_cache_tokens", "KV-cache capacity in tokens of the latest successful init.")
    required = gauge("xpu_unit_kv_cache_required_bytes",
                     "KV-cache memory needed to serve one request of the maximum model length.")
    concurrency = gauge("xpu_unit_kv_cache_max_concurrency",
                        "Requests of the maximum model length that fit in the KV cache at once.")
    starts = CounterFamily("xpu_unit_engine_starts_total", "Engine inits that succeeded.", labels=["unit"])
    failures = CounterFamily("xpu_unit_engine_init_failures_total", "Engine inits that failed, by reason.",
                             labels=["unit", "reason"])
    last_failure = gauge("xpu_unit_engine_last_failure_timestamp_seconds", "Time of the latest failed engine init.")
    duration = gauge("xpu_unit_engine_init_duration_seconds", "Duration of the latest successful engine init.")
    overlaps = CounterFamily("xpu_unit_engine_init_overlaps_total",
                             "Engine inits of this unit that ran while another watched unit's init ran.",
                             labels=["unit"])
    gate_waits = CounterFamily("xpu_unit_gate_waits_total",
                               "Starts of this unit the init gate (vllm-xpu-gate) held back.", labels=["unit"])
    gate_wait_seconds = CounterFamily("xpu_unit_gate_wait_seconds_total",
                                      "Time this unit's starts spent in the init gate.", labels=["unit"])
    gate_timeouts = CounterFamily("xpu_unit_gate_timeouts_total",
                                  "Waits of this unit in the init gate that ran out (--timeout).",
                                  labels=["unit"])
    gate_ungated = CounterFamily("xpu_unit_gate_ungated_starts_total",
                                 "Starts of this unit its init gate client let go without a decision (no gate "
                                 "service answered, or the unit may not use AF_UNIX).", labels=["unit"])
    gate_legacy = CounterFamily("xpu_unit_gate_legacy_starts_total",
                                "Starts of this unit that ran the 0.2 init gate drop-in (ExecStartPre=+... "
                                "vllm-xpu-gate --unit %n: root in the unit).", labels=["unit"])
    shrinks = CounterFamily("xpu_unit_context_shrinks_total",
                            "Starts of this unit whose --max-model-len auto served a shorter context than the "
                            "model's full length (too little KV-cache memory).", labels=["unit"])
    plan_state = gauge("xpu_unit_startup_plan_state",
                       "What vLLM's own startup plan (VLLM_ENABLE_STARTUP_PLAN=1) did at the unit's latest start: "
                       "1 for its state (applied: a saved plan's KV budget, profiling skipped; fallback: free memory "
                       "below the plan's baseline, profiled again; saved: a first profiled start saved its plan), "
                       "0 for the others.", ("state",))
    plan_bytes = gauge("xpu_unit_startup_plan_bytes",
                       "The KV budget of vLLM's startup plan the latest start applied, or else saved.")
    plan_fallbacks = CounterFamily("xpu_unit_startup_plan_fallbacks_total",
                                   "Starts of this unit whose vLLM startup plan was not applied: free memory was "
                                   "below the baseline the plan recorded (another tenant held it).", labels=["unit"])
    sleep_freed = gauge("xpu_unit_sleep_freed_bytes",
                        "Device memory the running engine freed when it last went to sleep (vLLM sleep mode), since "
                        "its latest start; a wake takes it back.")
    sleep_used = gauge("xpu_unit_sleep_device_used_bytes",
                       "The device's used memory (every process's) right after the engine last went to sleep, as "
                       "vLLM printed it.")
    slept = gauge("xpu_unit_sleep_timestamp_seconds",
                  "When the running engine last went to sleep (vLLM sleep mode), since its latest start.")

    for view in views:
        unit = [view.unit]
        plan_fallbacks.add_metric(unit, view.startup_plan_fallbacks)
        starts.add_metric(unit, view.starts)
        overlaps.add_metric(unit, view.overlaps)
        gate_waits.add_metric(unit, view.gate_waits)
        gate_wait_seconds.add_metric(unit, view.gate_wait_seconds)
        gate_timeouts.add_metric(unit, view.gate_timeouts)
        gate_ungated.add_metric(unit, view.gate_ungated)
        gate_legacy.add_metric(unit, view.gate_legacy)
        shrinks.add_metric(unit, view.context_shrinks)
        for reason in FailureReason:
            failures.add_metric([view.unit, reason.value], view.failures[reason])
        if view.last_failure_usec is not None:
            last_failure.add_metric(unit, view.last_failure_usec / 1e6)
        if view.last_success is not None:
            _add(kv_tokens, unit, view.last_success.effective_kv_cache_tokens)
            _add(duration, unit, view.last_success.init_duration_seconds)
        latest = view.latest
        if latest is None:
            continue
        if latest.version or latest.model:
            info.add_metric([view.unit, latest.version or "", latest.model or ""], 1)
        _add(utilisation, unit, latest.effective_gpu_memory_utilization)
        _add(max_model_len, unit, latest.max_model_len)
        _add(requested_len, unit, latest.requested_max_model_len)
        _add(max_num_seqs, unit, latest.max_num_seqs)
        _add(budget, unit, latest.kv_cache_memory_bytes)
        _add(kv_bytes, unit, latest.effective_kv_cache_bytes)
        _add(required, unit, latest.effective_required_bytes)
        _add(concurrency, unit, latest.max_concurrency)
        if latest.startup_plan is not None:
            for state in StartupPlanOutcome:
                plan_state.add_metric([view.unit, state.value], float(state is latest.startup_plan))
        _add(plan_bytes, unit, latest.startup_plan_bytes)
        if latest.slept_usec is not None:
            slept.add_metric(unit, latest.slept_usec / 1e6)
            _add(sleep_freed, unit, latest.sleep_freed_bytes)
            _add(sleep_used, unit, latest.sleep_device_used_bytes)
    yield from (info, utilisation, max_model_len, requested_len, max_num_seqs, budget, kv_bytes, kv_tokens, required,
                concurrency, starts, failures, last_failure, duration, overlaps, gate_waits, gate_wait_seconds,
                gate_timeouts, gate_ungated, gate_legacy, shrinks, plan_state, plan_bytes, plan_fallbacks, sleep_freed, sleep_used,
                slept)


def _add(family: GaugeFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, value)
