"""The gate for containers on a real engine (Debian 12's rootful Podman, tests/containerengines.py): the
containers' entrypoint is the gate's container client (exporter/gate/container_wait.py, the project's package
bound in read-only, run by the image's own python3: nothing of the project installed in the image), the
service's socket bound in at its default path. Every time compared is one the containers or the engine wrote
(a container's own clock at its release, Podman's record of a container's end): no wall-clock assert.

What the service sees of Podman's containers here is their cgroups and Podman's state (the k8s-file log
driver: no log of theirs is read), so a released container holds its lease until its cgroup empties: the
lease the tests end by killing it. Docker's containers (json-file, read with --logs.docker) are the replayed
vLLM engines of tests/vllmunit.py, whose inits the service sees end in their own logs. A user's rootless
Podman runs in a booted systemd (tests/realsystemd.py), the service inside it. The shipped examples run on the
real engines in their own shape, what this machine cannot give them substituted: deploy/compose.gated.yaml on
dockerd (the test image for vLLM's, the replayed engines with the example's planned flags for `vllm serve`),
deploy/podman.gated.sh as written on Podman (a `PODMAN` that swaps the image and adds the test's options, and a
`vllm` in the container that runs the replayed engine with the script's own words), and
deploy/kubernetes/examples/gated-engines rendered by kubectl, its Deployments' pods played by `podman kube play`
(the test image, the same `vllm` stub, the hostPaths moved to the test's directories).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from vllm_xpu_exporter.runtimes.podman import podman_recorded

from bootrace import IDLE_RESERVED, budgeted
from containerengines import IMAGE_NAME, Dockerd, Podman
from fakeze import A770, GiB, FakeConfig, FakeMemoryModule, SharedDevice, fake_driver_env, write_config
from journalgen import write_journal
from polling import wait_for
from realsystemd import RealSystemd
from test_containers_real_engines import ROOTLESS_UID, inside, rootless_podman  # noqa: F401 (the fixture)
from gateproc import GATE, GateRun
from vllmunit import CHAT, EMBEDDING, SIXTEEN_GIB_GPU, STT, engine_command, read_events

REPO = Path(__file__).resolve().parents[2]
PACKAGE_INSIDE = "/vllm-xpu-gate/vllm_xpu_exporter"  # where docs/gate.md binds the package in
CLIENT = ["python3", f"{PACKAGE_INSIDE}/gate/container_wait.py", "--gpu-memory-utilization", "0.07",
          "--service-timeout", "20s"]
SOCKET_INSIDE = "/run/vllm-xpu-gate"
# What a released container runs: its release time by its own clock, then it stays (as an engine in its init)
RELEASED = ["python3", "-c", "import time; print('released at', time.time(), flush=True); time.sleep(600)"]


@pytest.fixture
def gate(tmp_path: Path, podman: Podman, fake_driver: Path) -> Iterator[Path]:
    """The gate service on the host, watching Podman's containers named vllm-*; the directory of its socket."""
    sockets = tmp_path / "gate"
    sockets.mkdir()
    config = tmp_path / "fake_ze.conf"
    write_config(config, FakeConfig(devices=(dataclasses.replace(
        A770, memory=(FakeMemoryModule(size=16 * GiB, free=13 * GiB),)),)))
    journal = write_journal(tmp_path / "empty.journal", [])
    service = GateRun("service", subprocess.Popen(
        [*GATE, "serve", "--listen", str(sockets / "gate.sock"), "--journal.file", str(journal),
         "--journal.containers", "podman/vllm-*", "--path.podman", str(podman.storage), "--poll-interval", "50ms"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**fake_driver_env(fake_driver, config), "PATH": "/usr/bin:/bin"}))
    assert wait_for(lambda: service.saw("serving on"), timeout=20), service.lines
    names = ("vllm-a", "vllm-b", "toolbox")
    podman.remove(*names)
    try:
        yield sockets
    finally:
        podman.remove(*names)
        service.stop()
        print("\n".join(service.lines))  # shown when a test fails


def gated(podman: Podman, sockets: Path, name: str, command: list[str]) -> None:
    podman.run(name, command, log_driver="k8s-file", options=[
        "-v", f"{REPO / 'exporter'}:{PACKAGE_INSIDE}:ro", "-v", f"{sockets}:{SOCKET_INSIDE}"])


def logs(podman: Podman, name: str) -> str:
    completed = subprocess.run([*podman.command(), "logs", name], capture_output=True, text=True)
    return completed.stdout + completed.stderr


def released_at(podman: Podman, name: str) -> float | None:
    found = re.search(r"released at (\d+\.\d+)", logs(podman, name))
    return float(found.group(1)) if found else None


def test_a_container_killed_in_its_init_releases_its_lease_to_the_next_within_2_s(gate: Path, podman: Podman):
    """vllm-a goes through the gate (its lease) and runs; vllm-b waits for `podman/vllm-a`; vllm-a is killed:
    vllm-b's engine starts within 2 s of vllm-a's end as Podman recorded it."""
    gated(podman, gate, "vllm-a", [*CLIENT, "--", *RELEASED])
    assert wait_for(lambda: released_at(podman, "vllm-a"), timeout=60, interval=0.2), logs(podman, "vllm-a")
    gated(podman, gate, "vllm-b", [*CLIENT, "--", *RELEASED])
    assert wait_for(lambda: "waiting for podman/vllm-a" in logs(podman, "vllm-b"), timeout=60, interval=0.2), \
        logs(podman, "vllm-b")
    podman.cli("kill", "vllm-a")
    assert wait_for(lambda: released_at(podman, "vllm-b"), timeout=30, interval=0.2), logs(podman, "vllm-b")
    ended = podman.inspect("vllm-a", "{{.State.FinishedAt.Unix}}.{{printf \"%09d\" .State.FinishedAt.Nanosecond}}")
    assert 0 <= released_at(podman, "vllm-b") - float(ended) < 2.0, (ended, logs(podman, "vllm-b"))
    assert "waited for podman/vllm-a" in logs(podman, "vllm-b"), logs(podman, "vllm-b")


def test_a_container_that_is_no_watched_engine_and_holds_the_socket_delays_nobody(gate: Path, podman: Podman):
    """toolbox (no vLLM engine: outside --journal.containers) keeps a connection to the socket open and asks
    through the client: it is answered at once and leases nothing, so vllm-a, asking next, goes at once."""
    program = ("import socket, subprocess, sys\n"
               "held = socket.socket(socket.AF_UNIX)\n"
               f"held.connect('{SOCKET_INSIDE}/gate.sock')\n"
               f"subprocess.run({CLIENT!r} + ['--', 'true'])\n"
               "print('asked', flush=True)\n"
               "held.recv(1 << 16)\n"
               "import time; time.sleep(600)\n")
    gated(podman, gate, "toolbox", ["python3", "-c", program])
    assert wait_for(lambda: "asked" in logs(podman, "toolbox"), timeout=60, interval=0.2), logs(podman, "toolbox")
    assert "podman/toolbox is not a watched container" in logs(podman, "toolbox"), logs(podman, "toolbox")
    gated(podman, gate, "vllm-a", [*CLIENT, "--", *RELEASED])
    assert wait_for(lambda: released_at(podman, "vllm-a"), timeout=60, interval=0.2), logs(podman, "vllm-a")
    assert "waited for nothing" in logs(podman, "vllm-a"), logs(podman, "vllm-a")


def replay_device(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The replayed engines' directory (bound into their containers), the fake GPU's config and the events file."""
    device = tmp_path / "device"
    device.mkdir()
    config, events = device / "ze.conf", device / "events.jsonl"
    SharedDevice.create(config, SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)  # free < total: the memory is checked
    return device, config, events


def gate_service(sockets: Path, fake_driver: Path, config: Path, *args: str) -> GateRun:
    """The gate service on the host listening in `sockets` (the journal empty), watching as `args` say."""
    sockets.mkdir()
    service = GateRun("service", subprocess.Popen(
        [*GATE, "serve", "--listen", str(sockets / "gate.sock"), "--journal.file",
         str(write_journal(sockets.parent / "empty.journal", [])), "--poll-interval", "50ms", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**fake_driver_env(fake_driver, config), "PATH": "/usr/bin:/bin"}))
    if not wait_for(lambda: service.saw("serving on"), timeout=20):
        service.stop()
        pytest.fail(f"the gate service did not serve: {service.lines}")
    return service


def served(events: Path, names: set[str], service: GateRun) -> list[dict]:
    """The engines' events once every engine of `names` serves, none of their inits having failed."""
    assert wait_for(lambda: {record["unit"] for record in read_events(events) if record["event"] == "serving"}
                    == names, timeout=120, interval=0.2), (read_events(events), service.lines)
    records = read_events(events)
    assert not any(record["event"] == "failed" for record in records), records
    return records


def serving_kv(records: list[dict]) -> dict[str, int]:
    return {record["unit"]: record["kv_bytes"] for record in records if record["event"] == "serving"}


def docker_replays(tmp_path: Path, dockerd: Dockerd, fake_driver: Path, engines) -> tuple[list[dict], dict[str, str]]:
    """`engines` (tests/vllmunit.py's replays on the fake GPU), Docker containers of the json-file log driver
    started at the same moment, each through the gate's client with its R, the service reading their logs
    (--logs.docker) and Docker's state: the engines' events once all serve, and each container's log."""
    device, config, events = replay_device(tmp_path)
    sockets = tmp_path / "gate"
    service = gate_service(sockets, fake_driver, config, "--journal.containers", "docker/vllm-*", "--logs.docker",
                           "--path.docker", str(dockerd.data_root))
    names = [f"vllm-{engine.role}" for engine in engines]
    dockerd.remove(*names)
    try:
        starts = [threading.Thread(target=dockerd.run, args=(f"vllm-{engine.role}", [
            *CLIENT[:2], "--gpu-memory-utilization", str(engine.gpu_memory_utilization), "--service-timeout", "20s",
            "--", *engine_command(engine, f"vllm-{engine.role}", device_config=config, time_scale=0.1, events=events,
                                  python="python3", requests=0)]), kwargs={
            "log_driver": "json-file", "volumes": [device], "options": [
                "-v", f"{REPO}:{REPO}:ro", "-v", f"{REPO / 'exporter'}:{PACKAGE_INSIDE}:ro",
                "-v", f"{sockets}:{SOCKET_INSIDE}", "--env", "PYTHONPATH=/vllm-xpu-gate"]}) for engine in engines]
        for start in starts:
            start.start()
        for start in starts:
            start.join()
        records = served(events, set(names), service)
        return records, {name: subprocess.run([*dockerd.command(), "logs", name], capture_output=True,
                                              text=True).stderr for name in names}
    finally:
        dockerd.remove(*names)
        service.stop()
        print("\n".join(service.lines))  # shown when a test fails


def test_two_replayed_engines_started_together_in_containers_through_the_gate_do_not_overlap_their_inits(
        tmp_path: Path, dockerd: Dockerd, fake_driver: Path):
    """chat and embedding, sizing their KV caches from free memory: the service lets one begin its init only
    once the other's has ended, as the engines' own events say; both serve."""
    records, logs = docker_replays(tmp_path, dockerd, fake_driver, (CHAT, EMBEDDING))
    at = {(record["unit"], record["event"]): record["at"] for record in records}
    first, second = sorted(logs, key=lambda name: at[name, "started"])
    assert at[first, "serving"] <= at[second, "started"], records
    assert f"waited for docker/{first}" in logs[second], logs[second]


def test_containers_whose_recorded_command_carries_the_plans_budget_init_together(tmp_path: Path, dockerd: Dockerd,
                                                                                  fake_driver: Path):
    """chat and embedding with the plan's --kv-cache-memory-bytes in the command Docker recorded at their
    creation (as the planner's Compose output sets it): the service admits them by the plan, as units with
    root's plan drop-in, so their inits run side by side; each KV cache holds its budget and neither fails."""
    engines = (budgeted(CHAT, 131072 * 26624), budgeted(EMBEDDING, 512 * 1024 * 1024))
    records, logs = docker_replays(tmp_path, dockerd, fake_driver, engines)
    began = [record["at"] for record in records if record["event"] == "started"]
    allocated = [record["at"] for record in records if record["event"] == "allocated"]
    assert max(began) < min(allocated), (records, logs)  # the inits overlapped
    assert all("waited for nothing" in log for log in logs.values()), logs
    assert serving_kv(records) == {f"vllm-{engine.role}": engine.kv_cache_memory_bytes for engine in engines}


SHIPPED_COMPOSE = REPO / "deploy" / "compose.gated.yaml"
PLAN_LABEL = "io.vllm-xpu.plan.kv-cache-memory-bytes"


def flag(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_the_shipped_compose_example_starts_its_three_engines_through_the_gate_by_their_plan(
        tmp_path: Path, dockerd: Dockerd, fake_driver: Path):
    """deploy/compose.gated.yaml as Compose resolves it: each service's entrypoint is the gate's client with the
    socket directory and the package bound in, its command carries the plan, its label the same budget. Run
    on the real dockerd with all three services brought up at once (`up -d`), the test image and the replayed
    engines (their shipped R and budget) standing in for vLLM's image and `vllm serve`, its json-file logs read
    by the service (--logs.docker): each passes the gate (admitted by the budget Docker recorded in its command,
    beside the others where their footprints fit), none fails, and each engine's KV is its planned budget."""
    resolved = subprocess.run(["/usr/bin/docker-compose", "-f", str(SHIPPED_COMPOSE), "config"], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path,
                              env={**os.environ, "VLLM_XPU_GATE_CLIENT": str(REPO / "exporter")})
    assert resolved.returncode == 0, resolved.stderr
    services = yaml.safe_load(resolved.stdout)["services"]
    replayed = {f"vllm-{engine.role}": engine for engine in (CHAT, EMBEDDING, STT)}
    assert set(services) == set(replayed)
    device, config, events = replay_device(tmp_path)
    sockets = tmp_path / "gate"
    budgets = {}
    for name, service in services.items():
        entrypoint, command = service["entrypoint"], service["command"]
        assert entrypoint[:2] == CLIENT[:2] and entrypoint[-1] == "--", entrypoint
        assert f"{SOCKET_INSIDE}:{SOCKET_INSIDE}:rw" in service["volumes"], service["volumes"]
        assert f"{REPO / 'exporter'}:{PACKAGE_INSIDE}:ro" in service["volumes"], service["volumes"]
        budget = flag(command, "--kv-cache-memory-bytes")
        assert service["labels"][PLAN_LABEL] == budget
        assert flag(entrypoint, "--gpu-memory-utilization") == flag(command, "--gpu-memory-utilization")
        budgets[name] = int(budget)
        engine = dataclasses.replace(replayed[name], kv_cache_memory_bytes=int(budget),
                                     gpu_memory_utilization=float(flag(command, "--gpu-memory-utilization")))
        service.update(
            image=IMAGE_NAME, network_mode="none", pid="host", logging={"driver": "json-file"},
            command=engine_command(engine, name, device_config=config, time_scale=0.1, events=events,
                                   python="python3", requests=0),
            volumes=[f"{sockets}:{SOCKET_INSIDE}", f"{REPO / 'exporter'}:{PACKAGE_INSIDE}:ro", f"{device}:{device}",
                     f"{REPO}:{REPO}:ro"],
            environment={"PYTHONPATH": "/vllm-xpu-gate"})
        del service["devices"]  # no GPU here: the fake one is a file
    substituted = tmp_path / "compose.yaml"
    substituted.write_text(yaml.safe_dump({"version": yaml.safe_load(resolved.stdout).get("version", "3.7"),
                                           "services": services}))
    service = gate_service(sockets, fake_driver, config, "--journal.containers", "docker/*vllm-*", "--logs.docker",
                           "--path.docker", str(dockerd.data_root))
    compose = ["/usr/bin/docker-compose", "-p", "gated", "-f", str(substituted)]
    env = {**os.environ, "DOCKER_HOST": f"unix://{dockerd.socket}"}
    try:
        up = subprocess.run([*compose, "up", "-d"], env=env, capture_output=True, text=True, timeout=180)
        assert up.returncode == 0, up.stderr
        records = served(events, set(services), service)
        assert serving_kv(records) == budgets
        for name in services:
            printed = subprocess.run([*compose, "logs", "--no-color", name], env=env, capture_output=True,
                                     text=True, timeout=60).stdout
            assert "vllm-xpu-gate: released after" in printed, printed
    finally:
        subprocess.run([*compose, "down", "-t", "1"], env=env, capture_output=True, timeout=120)
        service.stop()
        print("\n".join(service.lines))  # shown when a test fails


SHIPPED_PODMAN = REPO / "deploy" / "podman.gated.sh"
SHIPPED_IMAGE = "vllm/vllm-openai-xpu:v0.24.0"
# What the shipped script's `podman run` gets here: the test's Podman, image and sockets, no GPU node, the
# replay's files, the `vllm` stub first on the container's PATH
PODMAN_WRAPPER = """import os, sys
podman, sockets, options = {podman!r}, {sockets!r}, {options!r}
words = sys.argv[1:]
index = words.index("--device")
del words[index:index + 2]
words = [{{"/run/vllm-xpu-gate:/run/vllm-xpu-gate": sockets + ":/run/vllm-xpu-gate", {shipped!r}: {image!r}}}.get(word, word)
         for word in words]
os.execv(podman[0], [*podman, words[0], *options, *words[1:]])
"""
VLLM_STUB = """#!/usr/bin/python3
import os, sys
replayed = {commands!r}  # model -> the replayed engine's command
command = replayed[sys.argv[2]] + sys.argv[3:]  # vllm serve MODEL FLAGS...: the engine's own, then the script's
os.execv(command[0], command)
"""


def test_the_shipped_podman_example_run_as_written_starts_its_engines_through_the_gate_by_their_plan(
        tmp_path: Path, podman: Podman, fake_driver: Path):
    """deploy/podman.gated.sh run by sh, all three containers at once: through the gate's client (the service
    reading their k8s-file logs, --logs.podman; admitted by the budget in the command Podman recorded), none
    fails, and each engine's KV is the budget the script gave it."""
    device, config, events = replay_device(tmp_path)
    sockets = tmp_path / "gate"
    names = {engine.model: f"vllm-{engine.role}" for engine in (CHAT, EMBEDDING, STT)}
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "vllm").write_text(VLLM_STUB.format(commands={
        engine.model: engine_command(engine, names[engine.model], device_config=config, time_scale=0.1,
                                     events=events, python="/usr/bin/python3", requests=0)
        for engine in (CHAT, EMBEDDING, STT)}))
    (stub / "vllm").chmod(0o755)
    options = ["--network", "none", "--pid", "host", "--log-driver", "k8s-file", *podman.run_options(),
               "-v", f"{device}:{device}", "-v", f"{REPO}:{REPO}:ro", "-v", f"{stub}:/usr/local/bin:ro",
               "--env", "PYTHONPATH=/vllm-xpu-gate"]
    wrapper = tmp_path / "podman.py"
    wrapper.write_text(PODMAN_WRAPPER.format(podman=podman.command(), sockets=str(sockets), options=options,
                                             shipped=SHIPPED_IMAGE, image=podman.image))
    service = gate_service(sockets, fake_driver, config, "--journal.containers", "podman/vllm-*", "--logs.podman",
                           "--path.podman", str(podman.storage))
    podman.remove(*names.values())
    try:
        run = subprocess.run(["sh", str(SHIPPED_PODMAN)], capture_output=True, text=True, timeout=180, env={
            **os.environ, "PODMAN": f"{sys.executable} {wrapper}", "VLLM_XPU_GATE_CLIENT": str(REPO / "exporter")})
        assert run.returncode == 0, run.stderr
        records = served(events, set(names.values()), service)
        script = SHIPPED_PODMAN.read_text()
        planned = {name: int(re.search(rf"^gated {name} \S+ (\d+) ", script, re.MULTILINE).group(1))
                   for name in names.values()}
        assert serving_kv(records) == planned
        for name in names.values():
            assert "vllm-xpu-gate: released after" in logs(podman, name), logs(podman, name)
    finally:
        podman.remove(*names.values())
        service.stop()
        print("\n".join(service.lines))  # shown when a test fails


SHIPPED_KUSTOMIZATION = REPO / "deploy" / "kubernetes" / "examples" / "gated-engines"
# What kube play cannot be told on its command line: the limits this machine's hard limits allow (as
# Podman.run_options) and the host's pid namespace (hostPID, which Podman 4.3's kube play ignores), so that the
# replayed engines' pids on the fake GPU are the host's, as in the other tests here
KUBE_PLAY_CONF = """[containers]
default_ulimits = [{ulimits}]
pidns = "host"
"""


def kube_play_pod(deployment: dict, image: str, host_paths: dict[str, str],
                  extra: dict[str, tuple[str, bool]]) -> dict:
    """The pod a rendered Deployment makes (its template as a Pod of the Deployment's name: Podman 4.3's kube
    play gives a Deployment's containers no annotation), with what this machine cannot give it substituted:
    the test image, no GPU resource (the fake GPU is a file), the hostPaths renamed as `host_paths` says, the
    `extra` hostPaths mounted (path inside: the path on the host, read-only or not), and a PATH (an imported
    image has none)."""
    template = deployment["spec"]["template"]
    spec = template["spec"]
    (engine,) = spec["containers"]
    engine["image"] = image
    del engine["resources"]
    engine["env"] = [{"name": "PATH", "value": "/usr/local/bin:/usr/bin:/bin"},
                     {"name": "PYTHONPATH", "value": "/vllm-xpu-gate"}]
    for volume in spec["volumes"]:
        volume["hostPath"]["path"] = host_paths[volume["hostPath"]["path"]]
    for index, (inside, (outside, read_only)) in enumerate(extra.items()):
        spec["volumes"].append({"name": f"test-{index}", "hostPath": {"path": outside, "type": "Directory"}})
        engine["volumeMounts"].append({"name": f"test-{index}", "mountPath": inside, "readOnly": read_only})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": deployment["metadata"]["name"],
                                                          **template["metadata"]}, "spec": spec}


def test_the_shipped_kustomization_played_as_pods_starts_its_engines_through_the_gate_by_their_plan(
        tmp_path: Path, podman: Podman, fake_driver: Path, kubectl: str):
    """deploy/kubernetes/examples/gated-engines rendered by `kubectl kustomize`, each Deployment's pod played at
    once by `podman kube play` (the nearest to a kubelet here: the pod's command and args, its hostPath volumes
    of type Directory, its annotations), the test image and the replayed engines (a `vllm` stub) standing in
    for vLLM's: each container passes the gate as the pod's container it is (its cgroup below the pod's, the
    service reading their k8s-file logs, --logs.podman; admitted by the budget in the command Podman
    recorded), none fails, each engine's KV is its planned budget, and the plan's annotation is where the
    exporter reads it."""
    rendered = subprocess.run([kubectl, "kustomize", str(SHIPPED_KUSTOMIZATION)], capture_output=True, text=True,
                              timeout=120)
    assert rendered.returncode == 0 and rendered.stderr == "", rendered.stderr
    deployments = [document for document in yaml.safe_load_all(rendered.stdout)
                   if document and document["kind"] == "Deployment"]
    replayed = {f"vllm-{engine.role}": engine for engine in (CHAT, EMBEDDING, STT)}
    assert {deployment["metadata"]["name"] for deployment in deployments} == set(replayed)
    device, config, events = replay_device(tmp_path)
    sockets = tmp_path / "gate"
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "vllm").write_text(VLLM_STUB.format(commands={
        engine.model: engine_command(engine, name, device_config=config, time_scale=0.1, events=events,
                                     python="/usr/bin/python3", requests=0) for name, engine in replayed.items()}))
    (stub / "vllm").chmod(0o755)
    package = {volume["hostPath"]["path"] for deployment in deployments
               for volume in deployment["spec"]["template"]["spec"]["volumes"]} - {SOCKET_INSIDE}
    assert len(package) == 1, package
    host_paths = {SOCKET_INSIDE: str(sockets), package.pop(): str(REPO / "exporter")}
    pods = tmp_path / "pods.yaml"
    pods.write_text(yaml.safe_dump_all([
        kube_play_pod(deployment, podman.image, host_paths,
                      {str(device): (str(device), False), str(REPO): (str(REPO), True),
                       "/usr/local/bin": (str(stub), True)})
        for deployment in deployments]))
    conf = tmp_path / "containers.conf"
    conf.write_text(KUBE_PLAY_CONF.format(ulimits=", ".join(f'"{limit}"' for limit in podman.run_options()[1::2])))
    budgets = {deployment["metadata"]["name"]: int(flag(deployment["spec"]["template"]["spec"]["containers"][0]["args"],
                                                        "--kv-cache-memory-bytes"))
               for deployment in deployments}
    service = gate_service(sockets, fake_driver, config, "--journal.containers", "podman/vllm-*", "--logs.podman",
                           "--path.podman", str(podman.storage))
    containers = {f"{name}-vllm" for name in replayed}  # kube play names a pod's container POD-CONTAINER
    try:
        played = subprocess.run([*podman.command(), "kube", "play", "--network", "none", "--log-driver", "k8s-file",
                                 str(pods)], capture_output=True, text=True, timeout=180,
                                env={**os.environ, "CONTAINERS_CONF": str(conf)})
        assert played.returncode == 0, played.stderr
        records = served(events, set(replayed), service)
        assert serving_kv(records) == budgets
        for name in replayed:
            printed = logs(podman, f"{name}-vllm")
            # released as a watched container, with the figures of its plan (one the service did not know as
            # its container would be let through at once: "not a watched unit", "free unknown, needed unknown")
            assert re.search(r"vllm-xpu-gate: released after \S+ \([^;]*; free \d+, needed \d+\)", printed), printed
            recorded = podman.storage / "overlay-containers" / podman.inspect(f"{name}-vllm", "{{.Id}}") / "userdata"
            assert podman_recorded((recorded / "config.json").read_bytes())[0] == budgets[name]
    finally:
        for name in containers:
            print(name, logs(podman, name), sep=":\n")  # shown when a test fails
        subprocess.run([*podman.command(), "kube", "play", "--down", str(pods)], capture_output=True, timeout=120)
        podman.remove(*containers)
        service.stop()
        print("\n".join(service.lines))  # shown when a test fails


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealSystemd]:
    """A booted systemd (a user's service manager for rootless Podman, a journald for its logs)."""
    with RealSystemd(tmp_path_factory.mktemp("rootless-gate")) as booted:
        yield booted


def test_a_rootless_users_container_asks_under_its_own_key_never_as_the_systems(machine: RealSystemd,
                                                                                 rootless_podman: Podman):
    """A user's rootless Podman container vllm-chat (below the user's user@UID.service) asks the service (run
    inside the booted system, where its pids are the container's): the service names it
    `podman/vllm-chat@uid<UID>`, the key the exporter gives it, not root's `podman/vllm-chat`."""
    sockets = machine.shared / "gate"
    sockets.mkdir()
    sockets.chmod(0o755)
    service = GateRun("service", subprocess.Popen(
        [*inside(machine), *GATE, "serve", "--listen", str(machine.inside(sockets / "gate.sock")),
         "--journal.directory", "/run/log/journal", "--journal.containers", "podman/none-*",
         "--path.podman", str(rootless_podman.storage)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    try:
        assert wait_for(lambda: service.saw("serving on"), timeout=30), service.lines
        rootless_podman.remove("vllm-chat")
        rootless_podman.run("vllm-chat", [*CLIENT, "--", "true"], log_driver="journald", options=[
            "-v", f"{REPO / 'exporter'}:{PACKAGE_INSIDE}:ro", "-v", f"{machine.inside(sockets)}:{SOCKET_INSIDE}"])

        def printed() -> str:  # what conmon sent the system journal for the container
            return machine.run("journalctl", "--no-pager", "-o", "cat", "CONTAINER_NAME=vllm-chat").stdout

        assert wait_for(lambda: "released after" in printed(), timeout=60, interval=0.3), printed()
        assert f"podman/vllm-chat@uid{ROOTLESS_UID} is not a watched container" in printed(), printed()
    finally:
        rootless_podman.remove("vllm-chat")
        service.stop()
        print("\n".join(service.lines))  # shown when a test fails
