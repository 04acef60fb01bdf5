"""Stub vLLM API servers: `/metrics` as vLLM's V1 engine writes it, for the families this project reads.

vLLM registers its metrics with prometheus_client (`vllm/v1/metrics/loggers.py`, `PrometheusStatLogger`), so a
registry holding the same families, with the same names, help texts, types and label names, gives the very
bytes vLLM serves (counters with their `_total` and `_created` samples). What each release has, as read in
vLLM's source:

- every release here: gauges `vllm:num_requests_running` and `vllm:num_requests_waiting`, gauge
  `vllm:kv_cache_usage_perc`, counter `vllm:num_preemptions` (served as `vllm:num_preemptions_total`), labels
  `model_name` and `engine` (the engine's index, "0"); `vllm:cache_config_info`, a gauge set to 1 whose labels
  are the engine's CacheConfig fields (their str()) and `engine`, without `model_name`;
- 0.10: also `vllm:gpu_cache_usage_perc` (the old name of the usage gauge, marked deprecated in its help), and
  no waiting-by-reason gauge;
- 0.2x and 0.34: no `vllm:gpu_cache_usage_perc` (hidden from 0.11, gone from 0.12); gauge
  `vllm:num_requests_waiting_by_reason` with a third label `reason`, `capacity` or `deferred`, the two adding
  up to `vllm:num_requests_waiting`; cache_config_info without `swap_space` (from 0.20.2) and with
  `kv_cache_size_tokens` and `kv_cache_max_concurrency` (from 0.24).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

VERSIONS = ("0.10.2", "0.24.0", "0.34.0")
LABELS = ["model_name", "engine"]
WAITING_REASONS = ("capacity", "deferred")


@dataclass
class CacheConfig:
    """What cache_config_info says: the fields this project reads, the others at their defaults."""

    block_size: int = 64
    gpu_memory_utilization: float = 0.75
    num_gpu_blocks: int = 1000
    kv_cache_memory_bytes: int | None = None
    max_num_seqs: int = 3  # not a CacheConfig field: the scheduler's, kept here for the stub's users
    max_model_len: int = 131072


def cache_config_labels(version: str, config: CacheConfig) -> dict[str, str]:
    """cache_config_info's labels as `CacheConfig.metrics_info()` gives them in `version` (str() of each field),
    then `engine`."""
    fields: dict[str, object] = {
        "block_size": config.block_size, "gpu_memory_utilization": config.gpu_memory_utilization,
        "swap_space": 4, "cache_dtype": "auto", "is_attention_free": False, "num_gpu_blocks_override": None,
        "sliding_window": None, "enable_prefix_caching": True, "prefix_caching_hash_algo": "sha256",
        "cpu_offload_gb": 0, "calculate_kv_scales": False, "kv_sharing_fast_prefill": False,
        "mamba_cache_dtype": "auto", "mamba_ssm_cache_dtype": "auto",
        "kv_cache_memory_bytes": config.kv_cache_memory_bytes,
        "num_gpu_blocks": config.num_gpu_blocks, "num_cpu_blocks": None}
    if version != "0.10.2":
        del fields["swap_space"]
        fields["kv_cache_size_tokens"] = (config.num_gpu_blocks - 1) * config.block_size
        fields["kv_cache_max_concurrency"] = round(fields["kv_cache_size_tokens"] / config.max_model_len, 2)
    return {**{name: str(value) for name, value in fields.items()}, "engine": "0"}


class VllmStub:
    """One vLLM API server's /metrics at `version` (one of VERSIONS); `set` changes what it says."""

    def __init__(self, version: str, model_name: str = "org/model", cache: CacheConfig | None = None) -> None:
        if version not in VERSIONS:
            raise ValueError(f"no stub of vLLM {version}")
        self.version = version
        self.registry = CollectorRegistry()
        values = [model_name, "0"]
        self._running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                              LABELS, registry=self.registry).labels(*values)
        self._waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                              LABELS, registry=self.registry).labels(*values)
        self._by_reason = {}
        if version != "0.10.2":
            by_reason = Gauge("vllm:num_requests_waiting_by_reason",
                              "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
                              "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV "
                              "transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
                              LABELS + ["reason"], registry=self.registry)
            self._by_reason = {reason: by_reason.labels(*values, reason) for reason in WAITING_REASONS}
        self._usage = [Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", LABELS,
                             registry=self.registry).labels(*values)]
        if version == "0.10.2":
            self._usage.append(Gauge("vllm:gpu_cache_usage_perc",
                                     "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use "
                                     "vllm:kv_cache_usage_perc instead.", LABELS, registry=self.registry
                                     ).labels(*values))
        self._preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                                    LABELS, registry=self.registry).labels(*values)
        config_labels = cache_config_labels(version, cache or CacheConfig())
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(config_labels),
              registry=self.registry).labels(**config_labels).set(1)
        self._server = None

    def set(self, running: int = 0, capacity: int = 0, deferred: int = 0, usage: float = 0.0,
            preempted: int = 0) -> None:
        """The scheduler's state now; `preempted` more preemptions since the last call."""
        self._running.set(running)
        self._waiting.set(capacity + deferred)
        for reason, count in (("capacity", capacity), ("deferred", deferred)):
            if reason in self._by_reason:
                self._by_reason[reason].set(count)
        for gauge in self._usage:
            gauge.set(usage)
        self._preemptions.inc(preempted)

    def serve(self) -> int:
        """Serve /metrics on 127.0.0.1 at a free port, returned."""
        self._server, _ = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        return self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
