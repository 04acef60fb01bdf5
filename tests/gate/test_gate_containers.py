"""The gate for containers, on a fake host (tests/gate/test_gate.py's `Host`: the fake GPU, a journal file, a fake
procfs and sysfs) with the container runtimes' state of tests/fakecontainers.py: the service knows a caller's
container from its cgroup by the exporter's key, leases only to a container's process that asks before its
container printed a vLLM start, and ends the lease when the container's cgroup empties. The same on real
engines: tests/real_systemd/test_gate_containers_real_engines.py."""

from __future__ import annotations

import os
from pathlib import Path

from fakecontainers import StateDirectories, container_id, docker_systemd_path, podman_rootless_path
from journalgen import container_output
from polling import wait_for
from test_gate import CHAT, Host, host  # noqa: F401 (host: the fixture)
from vllm_xpu_exporter.gate.decision import ContainerRun, container_waiting_invocation, lease_over

DOCKER_CHAT, DOCKER_EMBEDDING = container_id("chat"), container_id("embedding")


def containers(host: Host) -> StateDirectories:
    state = StateDirectories(host.tmp / "state")
    host.serve(*state.flags, "--journal.containers", "vllm-*")
    return state


def container_cgroup(host: Host, path: str, populated: bool = True) -> None:
    """The container's cgroup in the fake sysfs (cgroup v2's cgroup.events)."""
    directory = host.tmp / "sys" / "fs" / "cgroup" / path.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup.events").write_text(f"populated {int(populated)}\nfrozen 0\n")


def test_a_containers_caller_is_its_key_and_its_lease_ends_when_its_cgroup_empties(host: Host) -> None:
    """vllm-chat's entrypoint asks first and is released with a lease; vllm-embedding's waits for
    `docker/vllm-chat` (the exporter's key of the container, from its cgroup and Docker's state), and goes as
    soon as vllm-chat's cgroup is empty (the container died in its init), without --lease-timeout."""
    state = containers(host)
    for cid, name in ((DOCKER_CHAT, "vllm-chat"), (DOCKER_EMBEDDING, "vllm-embedding")):
        state.add_docker(cid, name)
        container_cgroup(host, docker_systemd_path(cid))
    code, chat = host.run("vllm-chat", "--gpu-memory-utilization", "0.07", cgroup=docker_systemd_path(DOCKER_CHAT))
    assert code == 0 and chat.decision.waited_for == () and not chat.saw("without a lease"), chat.lines
    embedding = host.start("vllm-embedding", "--gpu-memory-utilization", "0.07",
                           cgroup=docker_systemd_path(DOCKER_EMBEDDING))
    assert wait_for(lambda: embedding.saw("waiting for docker/vllm-chat"), timeout=20), embedding.lines
    container_cgroup(host, docker_systemd_path(DOCKER_CHAT), populated=False)
    assert embedding.wait() == 0 and embedding.decision.waited_for == ("docker/vllm-chat",), embedding.lines
    assert wait_for(lambda: host.service.saw("docker/vllm-chat's lease on"), timeout=5)
    assert host.service.saw("its container has no process"), host.service.lines


def test_a_container_outside_the_globs_or_unnamed_waits_for_nothing_and_holds_nobody(host: Host) -> None:
    """A container that is not a watched engine (its name outside --journal.containers, or no runtime's state
    names it) holds the socket and asks: answered at once, no lease; a watched container then asks and is
    released at once as well."""
    state = containers(host)
    tool, unnamed = container_id("tool"), container_id("unnamed")
    state.add_docker(tool, "toolbox")
    state.add_docker(DOCKER_CHAT, "vllm-chat")
    for cid in (tool, unnamed, DOCKER_CHAT):
        container_cgroup(host, docker_systemd_path(cid))
    code, run = host.run("toolbox", cgroup=docker_systemd_path(tool))
    assert code == 0 and run.saw("docker/toolbox is not a watched container"), run.lines
    code, run = host.run("unnamed", cgroup=docker_systemd_path(unnamed))
    assert code == 0 and run.saw("is not a watched container"), run.lines
    code, chat = host.run("vllm-chat", "--gpu-memory-utilization", "0.07", cgroup=docker_systemd_path(DOCKER_CHAT))
    assert code == 0 and chat.decision.waited_for == (), chat.lines


def test_a_rootless_users_container_never_passes_for_the_system_one_of_its_name_nor_holds_it_back(
        host: Host) -> None:
    """User 1000's rootless container vllm-chat asks first (`podman/vllm-chat@uid1000`, its lease); root's
    Podman container of the same name then goes at once: not taken for the user's, not held back by a user's
    lease. The user's second container waits for both leases: root's and its own user's."""
    state = containers(host)
    system, rootless, second = container_id("system"), container_id("rootless"), container_id("second")
    user_storage = host.tmp / "home" / "storage"
    state.add_podman(system, "vllm-chat")
    state.add_podman(rootless, "vllm-chat", storage=user_storage)
    os.chown(state.add_podman(second, "vllm-embedding", storage=user_storage), 1000, 1000)  # the user's, as Podman's
    host.stop_service()
    host.serve(*state.flags, "--path.podman", str(user_storage), "--journal.containers", "vllm-*")
    paths = {"system": f"/machine.slice/libpod-{system}.scope", "rootless": podman_rootless_path(rootless),
             "second": podman_rootless_path(second)}
    for path in paths.values():
        container_cgroup(host, path)
    code, user = host.run("vllm-chat@uid1000", "--gpu-memory-utilization", "0.07", cgroup=paths["rootless"])
    assert code == 0 and user.decision.waited_for == () and not user.saw("without a lease"), user.lines
    code, root = host.run("vllm-chat", "--gpu-memory-utilization", "0.07", cgroup=paths["system"])
    assert code == 0 and root.decision.waited_for == (), root.lines
    later = host.start("vllm-embedding@uid1000", "--gpu-memory-utilization", "0.07", cgroup=paths["second"])
    assert wait_for(lambda: later.saw("waiting for podman/vllm-chat@uid1000,podman/vllm-chat "), timeout=20), \
        later.lines


def test_a_process_of_a_container_that_printed_a_vllm_start_since_it_began_gets_no_lease(host: Host) -> None:
    """vllm-chat's logs (the journald log driver) show its engine's start after the asking process began (a
    process of a serving container, not its entrypoint before the engine): released without a lease, so
    vllm-embedding, asking next, is held back by chat's init only as the journal shows it."""
    state = containers(host)
    state.add_docker(DOCKER_CHAT, "vllm-chat")
    state.add_docker(DOCKER_EMBEDDING, "vllm-embedding")
    for cid in (DOCKER_CHAT, DOCKER_EMBEDDING):
        container_cgroup(host, docker_systemd_path(cid))
    host.write([container_output("vllm-chat", "INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.24.0",
                                 host.clock.tick(), container=DOCKER_CHAT),
                container_output("vllm-chat", "INFO 12-02 10:00:00 [utils.py:1] non-default args: {'model': 'm', "
                                 "'gpu_memory_utilization': 0.07}", host.clock.tick(), container=DOCKER_CHAT),
                container_output("vllm-chat", "INFO 12-02 10:00:01 [core.py:1] init engine (profile, create kv cache, "
                                 "warmup model) took 2.00 seconds", host.clock.tick(), container=DOCKER_CHAT)])
    code, squatter = host.run("vllm-chat", "--gpu-memory-utilization", "0.07", cgroup=docker_systemd_path(DOCKER_CHAT))
    assert code == 0 and squatter.saw("released without a lease"), squatter.lines
    code, embedding = host.run("vllm-embedding", "--gpu-memory-utilization", "0.07",
                               cgroup=docker_systemd_path(DOCKER_EMBEDDING))
    assert code == 0 and embedding.decision.waited_for == (), embedding.lines


def test_a_containers_lease_ends_at_once_with_its_cgroup_and_when_it_printed_nothing_within_the_engine_grace():
    """A unit's lease outlasts a briefly empty cgroup (between its client's exit and its engine's fork); a
    container's client becomes its engine (exec), so an empty cgroup ends it at once. A container that printed
    no vLLM start within the engine grace of its release is no engine: its lease ends."""
    from vllm_xpu_exporter.gate.decision import Lease
    container = Lease("0000:03:00.0", "docker/vllm-chat", "/docker/x", 1_000_000, 10**12, None, False, "run")
    unit = Lease("0000:03:00.0", CHAT, f"/system.slice/{CHAT}", 1_000_000, 10**12, None, False, "run")
    assert lease_over(container, None, 1_000_001, False) == "its container has no process"
    assert lease_over(unit, None, 1_000_001, False) is None
    assert lease_over(container, None, 1_000_001, True, engine_grace_usec=5_000_000) is None
    assert "no vLLM line within the engine grace" in lease_over(container, None, 6_000_000, True,
                                                                 engine_grace_usec=5_000_000)
    assert container_waiting_invocation(ContainerRun("run", 5), None) == "run"


def test_the_gate_service_takes_the_exporters_container_flags_and_gates_no_container_by_default() -> None:
    from vllm_xpu_exporter.gate.cli import parse_service_options
    options = parse_service_options(["--journal.containers", "vllm-*", "--path.docker", "/d", "--path.podman", "/p"],
                                    environ={})
    assert options.selection.container_globs == ("vllm-*",)
    assert options.selection.container_state["docker_roots"] == ("/d",)
    assert options.selection.matches_unit("docker/vllm-chat") and options.selection.matches_unit("podman/vllm-x@uid7")
    assert not options.selection.matches_unit("docker/tool")
    assert Path(options.selection.container_state["podman_storages"][0]) == Path("/p")
    by_default = parse_service_options([], environ={}).selection
    assert by_default.container_globs == () and not by_default.matches_unit("docker/vllm-chat")


def test_the_container_client_runs_from_the_package_directory_alone_and_becomes_the_engine(tmp_path: Path) -> None:
    """container_wait.py run as a file by an isolated python3 (no site-packages: nothing of the project
    installed), the package directory beside it as a container's bind would give it: with no service it starts
    ungated and execs the command in its own process (same pid); stopped while it waits (SIGTERM), it exits 143
    and runs nothing."""
    import signal
    import socket
    import subprocess
    import sys
    mounted = tmp_path / "vllm-xpu-gate"
    mounted.mkdir()
    (mounted / "vllm_xpu_exporter").symlink_to(Path(__file__).resolve().parents[2] / "exporter")
    client = [sys.executable, "-I", "-S", str(mounted / "vllm_xpu_exporter" / "gate" / "container_wait.py")]
    process = subprocess.Popen([*client, "--socket", str(tmp_path / "none.sock"), "--service-timeout", "0s", "--",
                                "sh", "-c", "echo $$"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0 and "started ungated" in err and out.strip() == str(process.pid), (out, err)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # accepts, never answers
    with silent:
        silent.bind(str(tmp_path / "silent.sock"))
        silent.listen(4)
        process = subprocess.Popen([*client, "--socket", str(tmp_path / "silent.sock"), "--service-timeout", "60s",
                                    "--", "sh", "-c", "echo engine"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        connection, _ = silent.accept()  # the client waits for an answer now
        with connection:
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=60)
    assert process.returncode == 143 and out == "" and "terminated while waiting" in err, (out, err)
