"""The stub vLLM servers (tests/vllmstub.py) serve each release's families with vLLM's names, types and labels."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllmstub import VERSIONS, CacheConfig, VllmStub



COMMON = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
          "vllm:kv_cache_usage_perc": "gauge", "vllm:num_preemptions": "counter", "vllm:cache_config_info": "gauge",
          # prometheus_client writes a counter's creation time as a gauge family of its own in the text format
          "vllm:num_preemptions_created": "gauge"}


def families(stub: VllmStub) -> dict:
    port = stub.serve()
    try:
        # the text format vLLM's /metrics answers a plain client with
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as response:
            text = response.read().decode()
    finally:
        stub.close()
    return {family.name: family for family in text_string_to_metric_families(text)}


@pytest.mark.parametrize("version, extra", [
    ("0.10.2", {"vllm:gpu_cache_usage_perc": "gauge"}),
    ("0.24.0", {"vllm:num_requests_waiting_by_reason": "gauge"}),
    ("0.34.0", {"vllm:num_requests_waiting_by_reason": "gauge"}),
])
def test_each_release_serves_its_families_with_vllms_types_and_labels(version, extra):
    stub = VllmStub(version, model_name="org/chat", cache=CacheConfig(num_gpu_blocks=2049, block_size=64,
                                                                      max_model_len=131072))
    stub.set(running=2, capacity=1, deferred=2, usage=0.25, preempted=5)
    found = families(stub)
    assert {name: family.type for name, family in found.items()} == {**COMMON, **extra}
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:num_preemptions"):
        assert {tuple(sorted(sample.labels)) for sample in found[name].samples if not sample.name.endswith("_created")} \
            == {("engine", "model_name")}, name
    preemptions = {sample.name: sample.value for sample in found["vllm:num_preemptions"].samples}
    assert preemptions["vllm:num_preemptions_total"] == 5
    assert found["vllm:num_requests_waiting"].samples[0].value == 3
    (info,) = found["vllm:cache_config_info"].samples
    assert "model_name" not in info.labels and info.labels["engine"] == "0" and info.value == 1
    assert info.labels["num_gpu_blocks"] == "2049"
    assert ("swap_space" in info.labels) == (version == "0.10.2")
    assert ("kv_cache_size_tokens" in info.labels) == (version != "0.10.2")
    if version != "0.10.2":
        assert info.labels["kv_cache_size_tokens"] == str(2048 * 64)
        by_reason = {sample.labels["reason"]: sample.value for sample in found["vllm:num_requests_waiting_by_reason"].samples}
        assert by_reason == {"capacity": 1, "deferred": 2}
    else:
        assert found["vllm:gpu_cache_usage_perc"].samples[0].value == 0.25


def test_an_unknown_release_has_no_stub():
    with pytest.raises(ValueError):
        VllmStub("0.9.0")
    assert VERSIONS == ("0.10.2", "0.24.0", "0.34.0")
