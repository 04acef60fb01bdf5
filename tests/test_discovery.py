"""/sd/vllm: the exporter as a process over a fixture procfs (three units, a Docker container in its own
network namespace, 300 other listeners), the fake Level Zero driver and a stub vLLM server behind the chat
unit's socket: every unit found with its address and labels, behind the web config's basic auth, and the
target Prometheus is given serves vLLM's /metrics."""

from __future__ import annotations

import base64
import dataclasses
import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_xpu_exporter.discovery import Target, render
from vllm_xpu_exporter.sources.containers import Workload
from vllm_xpu_exporter.sources.endpoints import Endpoint
from exporterproc import RunningExporter
from fakecontainers import StateDirectories
from fakeprocfs import CONTAINER_ADDRESS, CONTAINER_ID, FakeProcfs, vllm_api_host
from fakeze import A770, FakeConfig, FakeMemoryModule, fake_driver_env, write_config
from polling import wait_for
from sizes import GiB
from vllmstub import VllmStub
from webconfigs import basic_auth_users, write_web_config

import bcrypt

DEVICE = A770.pci_address
PASSWORD = "sd-s3cret"


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture
def stub():
    server = VllmStub("0.24.0", model_name="org/chat")
    server.set(running=2, capacity=1, usage=0.5, preempted=3)
    yield server
    server.close()


def test_sd_vllm_lists_every_unit_with_its_address_and_labels(tmp_path, fake_driver, stub):
    port = stub.serve()
    procfs = FakeProcfs(tmp_path / "host")
    vllm_api_host(procfs, others=300, vram=GiB, chat_port=port)
    state = StateDirectories(tmp_path / "state")
    state.add_docker(CONTAINER_ID, "vllm-c")
    device = dataclasses.replace(A770, memory=(FakeMemoryModule(size=16 * GiB, free=10 * GiB),))
    config = tmp_path / "fakeze.json"
    write_config(config, FakeConfig(devices=(device,)))
    web_config = write_web_config(tmp_path, basic_auth_users(
        {"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()}))
    with RunningExporter(["--path.procfs", str(procfs.root), *state.flags, "--no-collector.journal",
                          "--web.config.file", str(web_config)],
                         env=fake_driver_env(fake_driver, config)) as exporter:
        assert exporter.get("/sd/vllm")[0] == 401
        assert exporter.get("/sd/vllm", headers=basic("prometheus", "wrong"))[0] == 401
        auth = basic("prometheus", PASSWORD)

        def groups():
            status, headers, body = exporter.get("/sd/vllm", headers=auth)
            assert status == 200 and headers["Content-Type"] == "application/json"
            found = json.loads(body)
            return found if len(found) == 4 else None

        found = wait_for(groups)
    by_unit = {group["labels"]["unit"]: group for group in found}
    meta = {"__meta_vllm_xpu_found_by": "socket", "__meta_vllm_xpu_transport": "tcp"}
    assert by_unit["vllm-xpu-chat.service"] == {
        "targets": [f"127.0.0.1:{port}"],
        "labels": {"unit": "vllm-xpu-chat.service", "kind": "systemd", "device": DEVICE, **meta,
                   "__meta_vllm_xpu_pid": "100"}}
    assert by_unit["vllm-xpu-embedding.service"]["targets"] == ["[::1]:8002"]
    assert by_unit["vllm-xpu-stt.service"]["targets"] == ["/run/vllm/stt.sock"]
    assert by_unit["vllm-xpu-stt.service"]["labels"]["__meta_vllm_xpu_transport"] == "unix"
    container = by_unit["docker/vllm-c"]
    assert container["targets"] == [f"{CONTAINER_ADDRESS}:8000"]
    assert {key: container["labels"][key] for key in ("kind", "container", "container_id", "device")} == {
        "kind": "docker", "container": "vllm-c", "container_id": CONTAINER_ID, "device": DEVICE}
    # the target Prometheus would scrape is the stub vLLM behind the chat unit's socket
    with urllib.request.urlopen(f"http://{by_unit['vllm-xpu-chat.service']['targets'][0]}/metrics") as response:
        families = {family.name: family for family in text_string_to_metric_families(response.read().decode())}
    assert families["vllm:kv_cache_usage_perc"].samples[0].value == 0.5
    assert families["vllm:num_preemptions"].type == "counter"


def test_an_https_server_is_scraped_with_https_and_empty_workload_labels_are_left_out():
    target = Target(Endpoint(7, "https", "tcp", "10.0.0.2:8443", "command line"),
                    Workload("k8s/ns/pod/vllm", kind="k8s", namespace="ns", pod="pod", container="vllm"), None)
    assert json.loads(render([target])) == [{"targets": ["10.0.0.2:8443"], "labels": {
        "__meta_vllm_xpu_found_by": "command line", "__meta_vllm_xpu_pid": "7", "__meta_vllm_xpu_transport": "tcp",
        "__scheme__": "https", "container": "vllm", "kind": "k8s", "namespace": "ns", "pod": "pod",
        "unit": "k8s/ns/pod/vllm"}}]
