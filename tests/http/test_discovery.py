"""/sd/vllm: the exporter as a process over a fixture procfs (three units, a Docker container and a Kubernetes
pod each in its own network namespace, 300 other listeners), the fake Level Zero driver and a stub vLLM server behind the chat
unit's socket: every unit found with its address and labels, behind the web config's basic auth, and the
target Prometheus is given serves vLLM's /metrics."""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_xpu_exporter.discovery import Target, render
from vllm_xpu_exporter.planner.rightsizing import parse_observed
from vllm_xpu_exporter.sources.prometheus import read_observed
from vllm_xpu_exporter.sources.containers import Workload
from vllm_xpu_exporter.sources.endpoints import Endpoint
from exporterproc import RunningExporter
from fakecontainers import StateDirectories, container_id, kubepods_systemd_path, pod_uid
from fakeprocfs import CONTAINER_ADDRESS, CONTAINER_ID, FakeProcfs, vllm_api_host, xe_fdinfo
from fakeze import A770, FakeConfig, FakeMemoryModule, fake_driver_env, write_config
from polling import wait_for
from sizes import GiB
from vllmstub import VERSIONS, VllmStub
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
    # a Kubernetes pod's vLLM, in the pod's network namespace (pod IP 10.244.1.7), on --port 8080
    uid, cid = pod_uid("vllm-0"), container_id("vllm-0/vllm")
    state.add_pod_container("llm", "vllm-0", uid, "vllm", cid)
    pod_net = procfs.add_netns(4026533000, ipv4=("10.244.1.7",))
    for pid, argv in ((700, ("vllm", "serve", "org/pod-model", "--port", "8080")), (701, ("VLLM::EngineCore",))):
        process = procfs.add_unit_process(pid, kubepods_systemd_path(uid, cid))
        process.enter_network_namespace(pod_net)
        process.set_cmdline(*argv)
        if pid == 700:
            process.add_socket_fd(pod_net.add_tcp_listener("0.0.0.0", 8080))
        else:
            process.add_drm_fd(xe_fdinfo(client_id=701, vram0=GiB, unit=""))
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
            return found if len(found) == 5 else None

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
    pod = by_unit["k8s/llm/vllm-0/vllm"]
    assert pod["targets"] == ["10.244.1.7:8080"]
    assert {key: pod["labels"][key] for key in ("kind", "namespace", "pod", "pod_uid", "container", "device")} == {
        "kind": "k8s", "namespace": "llm", "pod": "vllm-0", "pod_uid": uid, "container": "vllm", "device": DEVICE}
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


def documented_job() -> dict:
    """The scrape job docs/discovery.md gives."""
    import re

    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / "discovery.md").read_text()
    block = next(block for block in re.findall(r"```yaml\n(.*?)```", text, re.S) if "http_sd_configs" in block)
    (job,) = yaml.safe_load(block)["scrape_configs"]
    return job


def test_the_documented_scrape_job_is_a_valid_prometheus_configuration(tmp_path):
    import subprocess

    import yaml

    job = documented_job()
    assert job["job_name"] == "vllm" and job["http_sd_configs"][0]["url"].endswith("/sd/vllm")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [job]}))
    checked = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("version", VERSIONS)
def test_prometheus_scrapes_the_discovered_vllm_and_the_rules_join_it_in_bytes(tmp_path, fake_driver, version):
    """Debian's Prometheus with the exporter's job and the documented vLLM job: the chat unit's stub vLLM (of
    each release: 0.10 serves both names of the usage gauge) is found through /sd/vllm, and
    unit:vllm_kv_cache_used:bytes is its usage times the KV bytes of the chat unit's journal ("Available KV
    cache memory: 3.36 GiB")."""
    import yaml

    from vllm_xpu_exporter.parsers.vllm import parse_line
    from journalgen import Clock, random_boot_id, write_journal
    from promstack import Prometheus
    from vllmlogs import VllmRun, unit_start

    stub = VllmStub(version, model_name="org/chat")
    stub.set(running=2, usage=0.5)
    port = stub.serve()
    procfs = FakeProcfs(tmp_path / "host")
    vllm_api_host(procfs, others=30, vram=GiB, chat_port=port)
    device = dataclasses.replace(A770, memory=(FakeMemoryModule(size=16 * GiB, free=10 * GiB),))
    config = tmp_path / "fakeze.json"
    write_config(config, FakeConfig(devices=(device,)))
    journal = write_journal(tmp_path / "units.journal", unit_start(
        "vllm-xpu-chat.service", VllmRun("0.24.0", gpu_memory_utilization=0.75, max_num_seqs=3, kv_cache_gib=3.36),
        Clock(random_boot_id())))
    kv_bytes = parse_line("Available KV cache memory: 3.36 GiB").kv_cache_bytes
    rules = Path(__file__).resolve().parents[2] / "rules" / "vllm-xpu-exporter.yaml"
    with RunningExporter(["--path.procfs", str(procfs.root), "--journal.file", str(journal), "--journal.boot", "all"],
                         env=fake_driver_env(fake_driver, config)) as exporter:
        address = exporter.base_url.split("://", 1)[1]
        prometheus = Prometheus(tmp_path / "prom", [address], [rules], start=False)
        job = documented_job()
        job["http_sd_configs"][0].update(url=f"{exporter.base_url}/sd/vllm", refresh_interval="1s")
        settings = yaml.safe_load(prometheus.config_path.read_text())
        settings["scrape_configs"].append(job)
        prometheus.config_path.write_text(yaml.safe_dump(settings))
        with prometheus:
            prometheus.start()
            used = wait_for(lambda: prometheus.query('unit:vllm_kv_cache_used:bytes{unit="vllm-xpu-chat.service"}'),
                            timeout=60)
            # vllm-xpu-plan --prometheus asks this Prometheus the same series (rightsizing's queries)
            observed = wait_for(lambda: parse_observed(read_observed(argparse.Namespace(
                prometheus=prometheus.url, observed=None, window=120.0,
                prometheus_selector=f'instance="{address}"'))).get("vllm-xpu-chat.service"), timeout=30)
    stub.close()
    (sample,) = used
    assert observed and observed[-1].usage == 0.5 and observed[-1].running == 2
    assert sample["metric"] == {"__name__": "unit:vllm_kv_cache_used:bytes", "instance": address, "job": "vllm",
                                "unit": "vllm-xpu-chat.service"}
    assert float(sample["value"][1]) == kv_bytes * 0.5
