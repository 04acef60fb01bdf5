"""vllm-xpu-plan for containers: the seed's race as Docker containers (json-file logs, tests/containerlogs.py) of
a Compose project planned like units, its override loaded by Debian's docker-compose over the project's own file;
a Podman container's create command planned; and what cannot be planned named (exit 3, nothing printed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_xpu_exporter.planner import containers
from vllm_xpu_exporter.planner.execstart import NotEditable
from vllm_xpu_exporter.sources import container_commands
from vllm_xpu_exporter.sources.container_commands import ContainerCommand
from containerlogs import RACE_CONTAINERS, write_race_docker
from journalgen import write_journal
from vllmlogs import CHAT, EMBEDDING, STT

SIXTEEN_GIB = 17179869184
COMPOSE = "/usr/bin/docker-compose"
SERVICES = {CHAT: "chat", EMBEDDING: "embedding", STT: "stt"}
CMD = {CHAT: ["vllm", "serve", "google/gemma-3-4b-it", "--max-model-len", "131072", "--gpu-memory-utilization",
              "0.75"],
       EMBEDDING: ["--model", "BAAI/bge-m3", "--gpu-memory-utilization=0.07"],
       STT: ["vllm", "serve", "openai/whisper-large-v3", "--gpu-memory-utilization", "0.07"]}
ENTRYPOINT = {EMBEDDING: ["vllm", "serve"]}  # vLLM's words split between the entrypoint and the command


def a_plan(unit: str = "docker/chat", kv: int = 3481927680, ratio: float = 0.7373):
    from vllm_xpu_exporter import memory_rules
    from vllm_xpu_exporter.planner.plans import Target, UnitPlan
    return UnitPlan(unit, "offline", "0.24.0", Target(1, "test"), 64, 1.0,
                    memory_rules.Footprint(kv_bytes=kv, weights_bytes=1, activation_bytes=None,
                                           non_torch_bytes=None, non_kv_bytes=1 << 30),
                    "test", ratio)


@pytest.mark.fast
def test_a_compose_command_loses_its_own_flags_and_ends_with_the_plans():
    command = ContainerCommand("docker/chat", "docker", "chat", cmd=tuple(CMD[CHAT]))
    assert containers.compose_command(a_plan(), command) == (
        "vllm", "serve", "google/gemma-3-4b-it", "--max-model-len", "131072",
        "--gpu-memory-utilization", "0.7373", "--kv-cache-memory-bytes", "3481927680")


@pytest.mark.fast
def test_vllm_serve_in_the_entrypoint_and_the_model_in_the_command_is_planned_in_the_command():
    command = ContainerCommand("docker/e", "docker", "e", cmd=tuple(CMD[EMBEDDING]), entrypoint=("vllm", "serve"))
    assert containers.compose_command(a_plan(), command)[:2] == ("--model", "BAAI/bge-m3")
    assert "--gpu-memory-utilization=0.07" not in containers.compose_command(a_plan(), command)


@pytest.mark.fast
def test_a_container_running_vllm_through_a_shell_string_is_refused():
    command = ContainerCommand("docker/chat", "docker", "chat", cmd=("sh", "-c", "vllm serve m"))
    with pytest.raises(NotEditable, match="sh -c"):
        containers.compose_command(a_plan(), command)


PLAN = "io.vllm-xpu.plan.kv-cache-memory-bytes=3481927680"


@pytest.mark.fast
def test_a_podman_create_command_is_replaced_with_the_plans_flags_after_its_command():
    words = ("podman", "run", "-d", "--name", "chat", "--device", "/dev/dri", "img", "vllm", "serve", "m",
             "--kv-cache-memory-bytes=5")
    line = containers.podman_command_line(a_plan("podman/chat"), ContainerCommand("podman/chat", "podman", "chat",
                                                                                   create_command=words))
    assert line == (f"podman run --replace --label {PLAN} --annotation {PLAN} -d --name chat --device /dev/dri img "
                    "vllm serve m --gpu-memory-utilization 0.7373 --kv-cache-memory-bytes 3481927680")


@pytest.mark.fast
def test_a_podman_container_planned_before_gets_the_new_plans_record_alone():
    """The create command of a container made from an earlier plan carries that plan's label and annotation
    (in both spellings): the new line has the new plan's once, and the container's other labels."""
    words = ("podman", "run", "--replace", "--label", "io.vllm-xpu.plan.kv-cache-memory-bytes=5", "-l", "team=a",
             "--annotation=io.vllm-xpu.plan.kv-cache-memory-bytes=5", "-d", "--name", "chat", "img", "vllm", "serve",
             "m")
    line = containers.podman_command_line(a_plan("podman/chat"), ContainerCommand("podman/chat", "podman", "chat",
                                                                                   create_command=words))
    assert line.startswith(f"podman run --label {PLAN} --annotation {PLAN} --replace -l team=a -d --name chat img ")
    assert line.count("io.vllm-xpu.plan") == 2


@pytest.mark.fast
def test_podmans_global_options_stay_before_its_run():
    words = ("/usr/bin/podman", "--root", "/srv/storage", "--log-level", "info", "run", "--name", "chat", "img",
             "vllm", "serve", "m")
    line = containers.podman_command_line(a_plan("podman/chat"), ContainerCommand("podman/chat", "podman", "chat",
                                                                                   create_command=words))
    assert line.startswith(f"/usr/bin/podman --root /srv/storage --log-level info run --replace --label {PLAN} "
                           f"--annotation {PLAN} --name chat img ")


@pytest.mark.fast
def test_a_podman_container_whose_command_is_the_images_is_refused():
    words = ("podman", "run", "-d", "--name", "chat", "img")
    with pytest.raises(NotEditable):
        containers.podman_command_line(a_plan("podman/chat"), ContainerCommand("podman/chat", "podman", "chat",
                                                                               create_command=words))


@pytest.mark.fast
def test_keys_name_their_runtime_and_rootless_user():
    assert container_commands.runtime_and_name("docker/chat@uid1000") == ("docker", "chat", 1000)
    assert container_commands.runtime_and_name("podman/chat") == ("podman", "chat", 0)
    assert container_commands.runtime_and_name("k8s/ns/pod/c") is None
    assert container_commands.runtime_of_key("vllm-xpu-chat.service") == "systemd"


@pytest.mark.fast
def test_a_config_of_another_name_or_without_a_command_gives_a_reason():
    config = {"Name": "/other", "Config": {"Cmd": ["vllm", "serve"]}}
    assert isinstance(container_commands.docker_command_of_config(json.dumps(config).encode(), "chat"), str)
    config = {"Name": "/chat", "Config": {"Cmd": None, "Entrypoint": None}}
    assert isinstance(container_commands.docker_command_of_config(json.dumps(config).encode(), "chat"), str)


# --- the planner over the race as a Compose project's containers ---------------------------------------------

def compose_project(tmp_path: Path, labelled: bool = True) -> tuple[Path, Path]:
    """The race as Docker containers with json-file logs, made by Compose project `seed` from `compose.yaml`
    (each container's config.v2.json as dockerd keeps it: its Cmd, Entrypoint and Compose's labels)."""
    root, project = tmp_path / "docker", tmp_path / "project"
    project.mkdir()
    compose_file = project / "compose.yaml"
    compose_file.write_text(yaml.safe_dump({"services": {
        SERVICES[u]: {"image": "vllm-xpu-test", "container_name": RACE_CONTAINERS[u], "command": CMD[u],
                      **({"entrypoint": ENTRYPOINT[u]} if u in ENTRYPOINT else {})} for u in SERVICES}}))
    written = write_race_docker(root)
    for unit, service in SERVICES.items():
        config_path = written[RACE_CONTAINERS[unit]].directory / "config.v2.json"
        config = json.loads(config_path.read_text())
        config["Config"]["Cmd"] = CMD[unit]
        config["Config"]["Entrypoint"] = ENTRYPOINT.get(unit)
        if labelled:
            config["Config"]["Labels"].update({
                "com.docker.compose.project": "seed", "com.docker.compose.service": service,
                "com.docker.compose.project.config_files": str(compose_file),
                "com.docker.compose.project.working_dir": str(project)})
        config_path.write_text(json.dumps(config))
    return root, compose_file


def run_plan(tmp_path: Path, root: Path, *args: str, logs: str = "docker") -> subprocess.CompletedProcess[str]:
    """The planner over the containers' log files under `root` (`logs`: docker's data root, or the pods' logs)."""
    empty = write_journal(tmp_path / "empty.journal", [])
    return subprocess.run([sys.executable, "-m", "vllm_xpu_exporter.planner", "--journal.file", str(empty),
                           "--journal.boot", "all", f"--path.{logs}", str(root), f"--logs.{logs}",
                           "--device-memory", str(SIXTEEN_GIB), *args],
                          capture_output=True, text=True, timeout=120, check=False)


def planned_json(tmp_path: Path, root: Path) -> dict[str, dict]:
    completed = run_plan(tmp_path, root, "--format", "json")
    assert completed.returncode == 0, completed.stderr
    return {u["unit"]: u for d in json.loads(completed.stdout)["devices"] for u in d["units"]}


def test_the_compose_projects_containers_are_planned_and_the_override_loads_over_its_file(tmp_path):
    root, compose_file = compose_project(tmp_path)
    planned = planned_json(tmp_path, root)
    assert set(planned) == {f"docker/{RACE_CONTAINERS[u]}" for u in SERVICES}  # other-llm is not watched
    completed = run_plan(tmp_path, root, "--format", "compose")
    assert completed.returncode == 0, completed.stderr
    override = tmp_path / "override.yaml"
    override.write_text(completed.stdout)
    merged = yaml.safe_load(subprocess.run([COMPOSE, "-f", str(compose_file), "-f", str(override), "config"],
                                           capture_output=True, text=True, check=True).stdout)
    for unit, service in SERVICES.items():
        plan = planned[f"docker/{RACE_CONTAINERS[unit]}"]
        command = merged["services"][service]["command"]
        assert command[-4:] == ["--gpu-memory-utilization", f"{plan['gpu_memory_utilization']:g}",
                                "--kv-cache-memory-bytes", str(plan["kv_cache_memory_bytes"])]
        assert command.count("--gpu-memory-utilization") == 1 and not any(
            word.startswith("--gpu-memory-utilization=") for word in command)
    assert merged["services"]["embedding"]["entrypoint"] == ["vllm", "serve"]


def test_an_override_compose_refuses_is_not_printed(tmp_path):
    root, compose_file = compose_project(tmp_path)
    compose_file.write_text(compose_file.read_text() + "volumes: 5\n")  # the project's own file no longer loads
    completed = run_plan(tmp_path, root, "--format", "compose")
    assert completed.returncode == 3
    assert completed.stdout == ""
    assert "docker-compose config refuses the override" in completed.stderr


def test_containers_not_made_by_compose_are_named_and_nothing_is_printed(tmp_path):
    root, _ = compose_project(tmp_path, labelled=False)
    completed = run_plan(tmp_path, root, "--format", "compose")
    assert completed.returncode == 3
    assert completed.stdout == ""
    assert f"docker/{RACE_CONTAINERS[CHAT]}: not started by Compose" in completed.stderr


def test_a_docker_container_asked_for_as_podman_or_systemd_is_not_applicable(tmp_path):
    root, _ = compose_project(tmp_path)
    for form, needs in (("podman", "--format compose"), ("systemd", "use --format compose or podman")):
        completed = run_plan(tmp_path, root, "--format", form)
        assert completed.returncode == 3, completed.stderr
        assert needs in completed.stderr


# --- the race as pods, planned as a kustomize overlay over the user's own base -----------------------------------

POD_ARGS = {CHAT: ["serve", "google/gemma-3-4b-it", "--max-model-len", "131072", "--gpu-memory-utilization", "0.75"],
            EMBEDDING: ["serve", "BAAI/bge-m3", "--gpu-memory-utilization=0.07"],
            STT: ["serve", "openai/whisper-large-v3", "--gpu-memory-utilization", "0.07"]}


def workload(kind: str, name: str, args: list[str]) -> dict:
    labels = {"app": name}
    pod = {"metadata": {"labels": labels}, "spec": {"containers": [
        {"name": "sidecar", "image": "busybox"},
        {"name": "vllm", "image": "vllm-xpu", "command": ["vllm"], "args": args}]}}
    spec = {"selector": {"matchLabels": labels}, "template": pod}
    if kind == "StatefulSet":
        spec["serviceName"] = name
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": "inference"}, "spec": spec}


def pods_and_base(tmp_path: Path) -> tuple[Path, Path]:
    from containerlogs import write_race_pods
    pods, base = tmp_path / "pods", tmp_path / "base"
    write_race_pods(pods)
    base.mkdir()
    documents = [workload("Deployment", "vllm-xpu-chat", POD_ARGS[CHAT]),
                 workload("StatefulSet", "vllm-xpu-embedding", POD_ARGS[EMBEDDING]),
                 workload("StatefulSet", "vllm-xpu-stt", POD_ARGS[STT])]
    (base / "engines.yaml").write_text(yaml.safe_dump_all(documents))
    (base / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["engines.yaml"]}))
    return pods, base


def test_the_pods_containers_are_planned_as_a_kustomize_overlay_kubectl_renders_with_the_plans_args(tmp_path, kubectl):
    from containerlogs import RACE_POD_KEYS
    pods, base = pods_and_base(tmp_path)
    completed = run_plan(tmp_path, pods, "--format", "json", logs="pods")
    assert completed.returncode == 0, completed.stderr
    planned = {u["unit"]: u for d in json.loads(completed.stdout)["devices"] for u in d["units"]}
    assert set(planned) == {RACE_POD_KEYS[u] for u in POD_ARGS}
    overlay = tmp_path / "overlays" / "planned"
    completed = run_plan(tmp_path, pods, "--format", "kustomize", "--kustomize-base", str(base),
                         "--output-dir", str(overlay), "--kubectl", kubectl, logs="pods")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == f"{overlay}/kustomization.yaml\n"
    rendered = {d["metadata"]["name"]: d for d in yaml.safe_load_all(subprocess.run(
        [kubectl, "kustomize", str(overlay)], capture_output=True, text=True, check=True).stdout)}
    for unit, args in POD_ARGS.items():
        plan = planned[RACE_POD_KEYS[unit]]
        sidecar, engine = rendered[RACE_POD_KEYS[unit].split("/")[2].rsplit("-", 2 if unit == CHAT else 1)[0]][
            "spec"]["template"]["spec"]["containers"]
        assert engine["args"] == [word for word in args if "gpu-memory-utilization" not in word and word not in (
            "0.75", "0.07")] + ["--gpu-memory-utilization", f"{plan['gpu_memory_utilization']:g}",
                                "--kv-cache-memory-bytes", str(plan["kv_cache_memory_bytes"])]
        assert "args" not in sidecar


def test_a_pod_no_workload_of_the_base_makes_is_named_and_nothing_is_written(tmp_path, kubectl):
    pods, base = pods_and_base(tmp_path)
    documents = list(yaml.safe_load_all((base / "engines.yaml").read_text()))[1:]  # no chat Deployment
    (base / "engines.yaml").write_text(yaml.safe_dump_all(documents))
    overlay = tmp_path / "overlay"
    completed = run_plan(tmp_path, pods, "--format", "kustomize", "--kustomize-base", str(base),
                         "--output-dir", str(overlay), "--kubectl", kubectl, logs="pods")
    assert completed.returncode == 3
    assert "no workload of the kustomization makes pod vllm-xpu-chat-7d9c5b6f4-x2x7q" in completed.stderr
    assert not overlay.exists()


def test_another_users_docker_container_is_not_read_for_its_command(tmp_path):
    """A rootless user's labels name the Compose files the planner would load: root does not follow them."""
    root, _ = compose_project(tmp_path)
    assert "run the planner as that user" in container_commands.docker_command(
        f"docker/{RACE_CONTAINERS[CHAT]}@uid{os.geteuid() + 4711}", [str(root)])
    assert isinstance(container_commands.docker_command(f"docker/{RACE_CONTAINERS[CHAT]}", [str(root)]),
                      ContainerCommand)
