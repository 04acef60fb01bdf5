// The knobs of the vllm-xpu-exporter mixin (mixin.libsonnet), with their defaults: the selectors, the
// cluster label, the runbook links, and each alert's thresholds, durations and severities. The shipped
// rules/vllm-xpu-exporter.yaml and grafana/vllm-xpu-exporter.json are the mixin with these defaults.
// Override them in jsonnet:
//
//   (import 'vllm-xpu-exporter-mixin/mixin.libsonnet') + { _config+:: { selector: 'job="gpu"' } }
//
// or from a shell, without jsonnet's command line (the Python package `jsonnet` evaluates it):
//
//   python3 rules/render.py --set selector='job="gpu"' --set memoryNearlyFullFreeRatio=0.1 \
//       > /etc/prometheus/rules/vllm-xpu-exporter.yaml
//   python3 rules/render.py --values my-values.yaml > /etc/prometheus/rules/vllm-xpu-exporter.yaml
//
// Every value is a string, written into PromQL or an alert as it is: names ending in For or Window are
// Prometheus durations (30s, 5m, 1h), Severity one of critical|warning|info, Ratio a number between 0 and 1,
// Bytes and Celsius numbers, Reasons throttle reasons joined by |, Selector label matchers without braces;
// showMultiCluster is 'true' or 'false'.
{
  _config+:: {
    // Label matchers that select the exporter's series, `up` included. Must match your scrape job.
    selector: 'job="vllm-xpu-exporter"',
    // The label that tells your clusters (or Prometheus replicas' sources) apart, as your Prometheus or its
    // scrape jobs attach it (external_labels, relabelling). Every aggregation and join keeps it, so alerts and
    // recorded series of two clusters never merge, even with the same instance and unit names. A series
    // without it counts as one cluster: the default changes nothing where no series has it.
    clusterLabel: 'cluster',
    // Label matchers that select the units whose unit alerts you want, e.g. unit=~"vllm-xpu-.*".
    unitSelector: 'unit!=""',
    // Where each alert's runbook_url leads: %s is its section's anchor, the alert's name in lower case
    // (xpuunitengineinitfailed). The default is Prometheus's own address ({{ $externalURL }}, its
    // --web.external-url) serving the runbook as a console template (consoles/vllm-xpu-exporter-runbook.html,
    // installed beside every shipped Prometheus: docs/alerts-and-dashboard.md): it opens wherever Prometheus's
    // links open, with Prometheus's scheme, whether or not the exporter is up, scraped or reachable. Or a copy
    // you publish: https://docs.example.com/vllm-xpu-exporter/runbook.html#%s. Never the firing series' labels.
    runbookURLPattern: '{{ $externalURL }}/consoles/vllm-xpu-exporter-runbook.html#%s',

    // The rate window of the recording rule unit:xpu_unit_engine_busy:ratio (per-unit engine busy).
    unitEngineBusyWindow: '5m',

    // Label matchers that select vLLM's own series, scraped through the exporter's /sd/vllm (docs/discovery.md):
    // the job of that scrape. Their `instance` must be the exporter's (the documented job sets it from the
    // discovery URL) and their `unit` the target's, so that they join the exporter's series on (instance, unit).
    vllmSelector: 'job="vllm"',
    // The rate window of the preemption rate unit:vllm_preemptions:rate5m (keep 5m: the name says it).
    vllmPreemptionsWindow: '5m',

    // The KV cache is too small for the load: the unit preempted requests, or requests waited for KV capacity,
    // while fewer than max_num_seqs ran (at max_num_seqs the cap is max_num_seqs, not the KV cache).
    kvCacheTooSmallForLoadFor: '10m',
    kvCacheTooSmallForLoadSeverity: 'warning',
    // The KV cache is much bigger than the load: over kvCacheOversizedWindow the unit never preempted nor had
    // a request waiting (for whatever reason), and its peak KV bytes in use plus this margin (a fraction of the peak), or one
    // max-length request if more, leave at least kvCacheOversizedMinFreeBytes of its KV cache unused.
    kvCacheOversizedWindow: '1d',
    kvCacheOversizedMarginRatio: '0.1',
    kvCacheOversizedMinFreeBytes: '1073741824',
    kvCacheOversizedFor: '1h',
    kvCacheOversizedSeverity: 'info',
    // The engine stalled: requests wait for capacity, none runs and the KV cache is idle (in use below this
    // fraction). Requests deferred (reason="deferred": a LoRA budget, a KV transfer) are not a stall.
    engineStalledKvUsageRatio: '0.01',
    engineStalledFor: '5m',
    engineStalledSeverity: 'critical',

    // An engine init failed: fires at once, stays for this long after the latest failure.
    engineInitFailedWindow: '15m',
    engineInitFailedSeverity: 'warning',

    // The latest start's KV cache cannot hold one request of max_model_len.
    kvCacheTooSmallFor: '5m',
    kvCacheTooSmallSeverity: 'warning',

    // The latest start serves a shorter context than it asked for (--max-model-len auto shrank it).
    contextShrunkFor: '5m',
    contextShrunkSeverity: 'warning',
    // The engine units of a GPU cannot all run at once at their targets (xpu_device_units_footprint_bytes):
    // their footprints add up to more than the GPU's total less this many bytes, the driver's own memory
    // (vllm-xpu-plan's --reserve, 512 MiB by default).
    unitsDoNotFitReserveBytes: '536870912',
    unitsDoNotFitFor: '15m',
    unitsDoNotFitSeverity: 'warning',
    // A unit's latest start ran with a KV budget other than the one vllm-xpu-plan's drop-in gives it, or with none
    // (xpu_unit_kv_cache_plan_bytes against xpu_unit_kv_cache_budget_bytes), for this long: a restart after the
    // plan was written takes a few seconds to show its budget.
    planNotAppliedFor: '10m',
    planNotAppliedSeverity: 'warning',
    // The KV cache holds fewer max-length requests than the unit's max_num_seqs.
    kvCacheBelowMaxNumSeqsFor: '15m',
    kvCacheBelowMaxNumSeqsSeverity: 'info',

    // The free device memory vLLM printed at a start is below (1 - this) x what the driver (Level Zero) had free
    // for it at that moment: the runtime misreported free memory (xpu_unit_engine_start_free_memory_bytes).
    freeMemoryMisreadRatio: '0.1',
    freeMemoryMisreadSeverity: 'warning',

    // Restart headroom below this many bytes: a restart now would fail.
    restartHeadroomThresholdBytes: '0',
    restartHeadroomFor: '5m',
    restartHeadroomDownSeverity: 'critical',
    restartHeadroomRunningSeverity: 'warning',

    // Engine inits of two units overlapped (the boot race); stays this long after the latest overlap.
    engineInitsOverlappedWindow: '1h',
    engineInitsOverlappedSeverity: 'info',

    // A gated unit started without the gate's decision (no gate service answered); stays this long.
    gateUngatedStartsWindow: '1h',
    gateUngatedStartsSeverity: 'warning',

    // A unit started through the 0.2 gate drop-in (ExecStartPre=+... vllm-xpu-gate --unit %n: root in the
    // unit); stays this long.
    gateLegacyDropInWindow: '1h',
    gateLegacyDropInSeverity: 'warning',

    // vLLM's own startup plan (VLLM_ENABLE_STARTUP_PLAN=1, vLLM 0.34) applied a budget that holds less than one
    // request of the length the unit asked for (its KV cache, or --max-model-len auto's shrunk context).
    startupPlanShortFor: '5m',
    startupPlanShortSeverity: 'warning',
    // The unit's startup plan fell back to profiling (free memory below its baseline: another tenant held it)
    // at least this many times within the window; stays this long after the latest fallback.
    startupPlanFallbacksWindow: '1h',
    startupPlanFallbacksMin: '2',
    startupPlanFallbacksSeverity: 'warning',

    // A sleeping unit (vLLM sleep mode) could not wake now: what it takes back is more than the free memory.
    wakeWouldNotFitFor: '5m',
    wakeWouldNotFitSeverity: 'warning',

    // Free device memory below this fraction of the total.
    memoryNearlyFullFreeRatio: '0.05',
    memoryNearlyFullFor: '15m',
    memoryNearlyFullSeverity: 'warning',

    // The device-local memory's health (xpu_memory_health) is degraded, critical or replace. `unknown` (the
    // driver does not report health, as upstream i915 and xe mostly do not) never fires.
    memoryUnhealthyFor: '5m',
    // degraded: correctable errors pile up, the device should be reset.
    memoryDegradedSeverity: 'warning',
    // critical: the device runs with memory left out for uncorrectable errors; replace: it should be replaced.
    memoryFailingSeverity: 'critical',

    // The driver cannot report real memory usage (no CAP_PERFMON).
    memoryAccountingUntrustedFor: '15m',
    memoryAccountingUntrustedSeverity: 'warning',

    // Used device memory that no process accounts for, above this fraction of the total.
    unattributedMemoryRatio: '0.1',
    unattributedMemoryFor: '30m',
    unattributedMemorySeverity: 'warning',

    // A frequency domain of the device is held down for one of these reasons: `|`-separated, of
    // average_power, burst_power, current, thermal, psu, software_range, hardware_range. The defaults are the
    // reasons that mean trouble: the cooling cannot keep up (thermal), the power supply asserted its alert
    // (psu). A busy GPU runs at its power limits (average_power: PL1, burst_power: PL2, current: PL4/ICCmax)
    // as designed; add them if your cards should never reach theirs.
    deviceThrottledReasons: 'thermal|psu',
    deviceThrottledFor: '10m',
    deviceThrottledSeverity: 'warning',

    // A device counted uncorrectable RAS errors: fires at once, stays for this long after the latest.
    // Errors counted before Prometheus first scraped the device do not fire (the dashboard shows them).
    deviceUncorrectableErrorsWindow: '1h',
    deviceUncorrectableErrorsSeverity: 'critical',

    // A temperature sensor the selector takes (sensor= gpu, global or memory) reads above this many degrees
    // Celsius. 95: above what a GPU with working cooling reaches under sustained load, below the junction
    // limit where its firmware throttles (thermal) and, past it, shuts the card down. See your card's limits.
    temperatureHighCelsius: '95',
    temperatureSensorSelector: 'sensor="gpu"',
    temperatureHighFor: '10m',
    temperatureHighSeverity: 'warning',

    // A collector of the exporter keeps failing.
    collectorFailingFor: '10m',
    collectorFailingSeverity: 'warning',

    // The exporter watches no vLLM unit: its --journal.units globs match nothing in the journal it reads.
    // unitsExpectedSelector: label matchers, added to `selector`, of the exporters expected to watch vLLM
    // units. The default takes every exporter `selector` takes. Leave out hosts without vLLM units (e.g.
    // instance!~"build-.*"), or turn the alert off with job!~".*", which matches no series.
    unitsExpectedSelector: 'job=~".+"',
    noUnitsWatchedFor: '1h',
    noUnitsWatchedSeverity: 'warning',

    // Prometheus cannot scrape the exporter / has no target for it at all.
    exporterDownFor: '5m',
    exporterDownSeverity: 'warning',
    exporterAbsentFor: '15m',
    exporterAbsentSeverity: 'warning',

    // Whether the dashboard offers its cluster variable (kube-prometheus's showMultiCluster). 'false' hides
    // it and every panel shows all clusters' series (the variable's All); the rules keep clusterLabel in every
    // aggregation either way.
    showMultiCluster: 'true',
  },
}
