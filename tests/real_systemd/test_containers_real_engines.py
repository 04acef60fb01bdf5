"""The replayed vLLM engines (tests/vllmunit.py) run inside real containers of Debian 12's engines
(tests/containerengines.py) on the fake GPU, and as systemd units of a real systemd (tests/realsystemd.py): the
exporter's per-workload series read from the real engines' state, cgroups and logs equal what it reports for
the same replay as units. Docker with the json-file log driver (a dockerd of the run's own) and the journald
one (Debian's docker.service in a booted systemd, whose journald it writes to); Podman with k8s-file (rootful,
on the host) and journald (rootful and a user's rootless Podman, in the booted systemd).

The replay, the same for every kind: chat, embedding and stt start one after another, each once the one
before serves (so no start's memory depends on another's timing), then `big`, which asks for 0.9 of the GPU
and fails for want of free memory. The exporter is started once they are all done, reads what they printed
from the start and is compared on the series that do not depend on when it all happened (durations,
timestamps and free memory at a start are left out).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from containerengines import DockerService, Dockerd, Podman, docker_defaults, started
from exporterproc import RunningExporter
from fakeze import SharedDevice, fake_driver_env
from journalgen import write_journal
from polling import wait_for
from realsystemd import SHARED_INSIDE, RealSystemd
from scrapes import Samples, sample, series
from vllm_xpu_exporter.parsers.cgroup import systemd_cgroup_path
from vllmunit import CHAT, EMBEDDING, SIXTEEN_GIB_GPU, STT, Engine, engine_command, read_events, unit_file

REPO = Path(__file__).resolve().parents[2]
ContainerEngine = Dockerd | Podman | DockerService
TIME_SCALE = 0.1
BIG = Engine("big", 0.9, 4096, 1.0, 20.0)  # 0.9 of the GPU while chat holds 0.75: insufficient_free_memory
SERVING = (CHAT, EMBEDDING, STT)
STEP_TIMEOUT = 60.0
SCRAPE_TIMEOUT = 30.0
# The replayed engines open no DRM render node, so the fake GPU has no DRM clients and per-process memory
# comes from Level Zero's process list, which the exporter uses when some processes' DRM clients cannot be
# read (docs/metrics.md, "Where per-unit memory comes from"): it runs as root without capabilities, so that
# the fdinfo of root's processes with capabilities is closed to it, while the files root owns (the journal,
# the engines' state and logs) are not.
EXPORTER = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", sys.executable, "-m", "vllm_xpu_exporter"]
# and reading a rootless user's Podman storage too (0700, the user's), as docs/containers.md asks of a deployment
EXPORTER_READING_USERS = ["setpriv", "--inh-caps=-all", "--bounding-set=-all,+dac_read_search", sys.executable, "-m",
                          "vllm_xpu_exporter"]
ROOTLESS_USER, ROOTLESS_UID = "vllm-rootless", 4711  # a uid no machine image's user has
# Series every kind has: the processes collector's, from the cgroups and the engines' memory
MEMORY = ("xpu_unit_memory_bytes",)
# and those of what the engines printed, for the kinds whose logs the exporter reads
PRINTED = ("xpu_unit_engine_starts_total", "xpu_unit_engine_init_failures_total", "xpu_unit_kv_cache_bytes",
           "xpu_unit_kv_cache_tokens", "xpu_unit_restart_headroom_bytes", "xpu_unit_memory_footprint_bytes")


@dataclass
class Replay:
    """One kind's run of the replay: the device its engines shared, the events they wrote, the exporter's
    arguments to read them, and the series' `unit` label of each engine."""

    device_config: Path
    events: Path
    keys: dict[str, str]  # unit label -> engine role
    args: list[str]
    workloads: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # unit -> (kind, container, its id)


def play(start: Callable[[Engine], None], events: Path, name: Callable[[Engine], str]) -> None:
    """Start the serving engines one after another, each once the one before serves, then BIG until it fails."""
    for engine in (*SERVING, BIG):
        start(engine)
        wanted = "failed" if engine is BIG else "serving"
        assert wait_for(lambda: any(record["unit"] == name(engine) and record["event"] == wanted
                                    for record in read_events(events)), timeout=STEP_TIMEOUT, interval=0.1), \
            f"{name(engine)}: no '{wanted}' within {STEP_TIMEOUT:.0f} s: {read_events(events)}"


def shared_device(directory: Path, for_everyone: bool = False) -> tuple[Path, Path]:
    """The fake GPU's config and the events file in `directory`; `for_everyone`: a rootless user's containers
    write them too."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "ze.conf"
    SharedDevice.create(config, SIXTEEN_GIB_GPU)
    if for_everyone:
        for path in (directory, *directory.iterdir()):
            path.chmod(0o777 if path.is_dir() else 0o666)
    return config, directory / "events.jsonl"


def container_name(engine: Engine) -> str:
    return f"vllm-{engine.role}"


@contextlib.contextmanager
def in_containers(engine: ContainerEngine, directory: Path, log_driver: str, args: Sequence[str],
                  seen: Callable[[Path], Path] = Path, for_everyone: bool = False) -> Iterator[Replay]:
    """The replay as containers of `engine`, the repository bound in read-only and the device's directory
    read-write, vllmunit run by the image's python3 with the exporter's vLLM grammar from the checkout; `args`:
    the exporter's to read them. `directory` is the host's path; `seen` gives a host path as the engine sees it
    (inside a RealSystemd). `for_everyone`: the directory's files are a rootless user's containers' to write too.
    The containers are removed after."""
    config, events = shared_device(directory, for_everyone)
    pythonpath = directory / "pythonpath"
    pythonpath.mkdir()
    (pythonpath / "vllm_xpu_exporter").symlink_to(REPO / "exporter")
    names = [container_name(each) for each in (*SERVING, BIG)]
    engine.remove(*names)

    def start(each: Engine) -> None:
        command = engine_command(each, container_name(each), device_config=seen(config), time_scale=TIME_SCALE,
                                 events=seen(events), python="python3", requests=0)
        engine.run(container_name(each), command, log_driver=log_driver, volumes=[seen(directory)],
                   options=["-v", f"{REPO}:{REPO}:ro", "--env", f"PYTHONPATH={seen(pythonpath)}"])

    try:
        play(start, events, container_name)
        kind = "podman" if isinstance(engine, Podman) else "docker"
        owner = f"@uid{engine.uid}" if isinstance(engine, Podman) and engine.uid else ""  # a rootless one's

        def key(each: Engine) -> str:
            return f"{kind}/{container_name(each)}{owner}"

        yield Replay(seen(config), events, {key(each): each.role for each in (*SERVING, BIG)}, list(args),
                     {key(each): (kind, container_name(each), engine.inspect(container_name(each), "{{.Id}}"))
                      for each in SERVING})
    finally:
        engine.remove(*names)


def exporter_series(replay: Replay, fake_driver: Path, printed: bool, command: Sequence[str] = EXPORTER) -> dict:
    """The series of the replay's engines once the exporter has read them all, under the engines' roles."""
    serving_keys = {key for key, role in replay.keys.items() if role != BIG.role}

    def ready(samples: Samples) -> bool:
        return (sample(samples, "xpu_exporter_collector_success", collector="journal") == 1
                and sample(samples, "xpu_exporter_collector_success", collector="processes") == 1
                and serving_keys <= {dict(labels)["unit"] for labels in series(samples, "xpu_unit_memory_bytes")}
                and (not printed or set(replay.keys) <= {
                    dict(labels)["unit"] for labels, value in series(samples, "xpu_unit_engine_starts_total").items()}
                     and sample(samples, "xpu_unit_engine_init_failures_total", unit=_key(replay, BIG.role),
                                reason="insufficient_free_memory") == 1))

    with RunningExporter(replay.args, env=fake_driver_env(fake_driver, replay.device_config),
                         command=command) as exporter:
        samples = wait_for(lambda: (scraped := exporter.scrape()) and ready(scraped) and scraped,
                           timeout=SCRAPE_TIMEOUT, interval=0.5)
        assert samples, f"the exporter never saw every engine: {exporter.scrape()}\n{exporter.stderr}"
    for key, (kind, name, cid) in replay.workloads.items():  # who each unit is, as the engine itself says
        info = [dict(labels) for labels in series(samples, "xpu_workload_info") if dict(labels)["unit"] == key]
        assert [(each["kind"], each["container"], each["container_id"]) for each in info] == [(kind, name, cid)], info
    families = (*MEMORY, *PRINTED) if printed else MEMORY
    out = {}
    for (name, labels), value in samples.items():
        labels = dict(labels)
        if labels.get("unit") in replay.keys and name in families:
            out[name, tuple(sorted({**labels, "unit": replay.keys[labels["unit"]]}.items()))] = value
    return out


def _key(replay: Replay, role: str) -> str:
    return next(key for key, each in replay.keys.items() if each == role)


@pytest.fixture(scope="module")
def units_series(tmp_path_factory: pytest.TempPathFactory, fake_driver: Path) -> dict:
    """The replay as systemd units of a real systemd, read from its journal."""
    if os.geteuid() != 0:
        pytest.fail("booting a real systemd needs root (tests/run runs as root)")
    shared = tmp_path_factory.mktemp("units")
    config, events = shared_device(shared / "device")
    shutil.copy(fake_driver, shared / fake_driver.name)
    with RealSystemd(shared) as machine:
        for engine in (*SERVING, BIG):
            machine.write_unit(f"vllm-{engine.role}.service", unit_file(
                engine, device_config=machine.inside(config), events=machine.inside(events), time_scale=TIME_SCALE,
                requests=0, restart="no"))
        machine.daemon_reload()
        play(lambda engine: machine.start(f"vllm-{engine.role}.service"), events,
             lambda engine: f"vllm-{engine.role}.service")
        machine.sync_journal()
        # The exporter runs inside, where the units' pids (which the engines record on the fake GPU) are theirs
        replay = Replay(machine.inside(config), events,
                        {f"vllm-{engine.role}.service": engine.role for engine in (*SERVING, BIG)},
                        ["--journal.directory", "/run/log/journal", "--journal.units", "vllm-*.service"])
        return exporter_series(replay, machine.inside(shared / fake_driver.name), printed=True,
                               command=["nsenter", "-t", str(machine.pid1), "-a", *EXPORTER])


def empty_journal(directory: Path) -> list[str]:
    return ["--journal.file", str(write_journal(directory / "empty.journal", []))]


def test_the_units_replay_has_every_compared_series(units_series: dict):
    """The baseline itself: memory of the three serving engines, and what each printed, big's failure too."""
    for family in (*MEMORY, *PRINTED):
        roles = {dict(labels)["unit"] for name, labels in units_series if name == family}
        assert roles >= {engine.role for engine in SERVING}, (family, roles)
    failures = {dict(labels)["unit"]: value for (name, labels), value in units_series.items()
                if name == "xpu_unit_engine_init_failures_total"
                and dict(labels)["reason"] == "insufficient_free_memory"}
    assert failures[BIG.role] == 1 and failures[CHAT.role] == 0


def test_docker_json_file_containers_give_the_units_series(tmp_path: Path, dockerd: Dockerd, fake_driver: Path,
                                                           units_series: dict):
    """Docker's names (config.v2.json), cgroups (/docker/<id>, the cgroupfs driver) and json-file logs
    (--logs.docker) of real containers: every compared series of the units, with the same values."""
    args = [*empty_journal(tmp_path), "--logs.docker", "--path.docker", str(dockerd.data_root)]
    with in_containers(dockerd, tmp_path, "json-file", args) as replay:
        assert exporter_series(replay, fake_driver, printed=True) == units_series


def test_podman_k8s_file_containers_give_the_units_series(tmp_path: Path, podman: Podman, fake_driver: Path,
                                                          units_series: dict):
    """Podman's names (containers/storage's containers.json), cgroups (/libpod_parent/libpod-<id>, the cgroupfs
    manager) and k8s-file logs (conmon's CRI lines in userdata/ctr.log, --logs.podman) of real containers: every
    compared series of the units, with the same values, as from the journald log driver below."""
    args = [*empty_journal(tmp_path), "--logs.podman", "--path.podman", str(podman.storage)]
    with in_containers(podman, tmp_path, "k8s-file", args) as replay:
        for _, container, _ in replay.workloads.values():  # where Podman itself says the log is
            log_path = podman.inspect(container, "{{.HostConfig.LogConfig.Path}}")
            assert Path(log_path).is_relative_to(podman.storage) and log_path.endswith("/userdata/ctr.log"), log_path
        assert exporter_series(replay, fake_driver, printed=True) == units_series


# ---- the journald log driver: the engines inside a real systemd, whose journald they write to --------------


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory, fake_driver: Path) -> Iterator[RealSystemd]:
    """A real systemd with Debian's docker.service and containerd.service as shipped (the data root on the
    shared directory: overlay2 does not work on the booted root's overlay), the fake driver beside."""
    shared = tmp_path_factory.mktemp("engines")
    shutil.copy(fake_driver, shared / fake_driver.name)
    with RealSystemd(shared, keep_enabled=("docker.service", "docker.socket", "containerd.service"),
                     files={"/etc/default/docker": docker_defaults(SHARED_INSIDE / "docker")}) as booted:
        yield booted


def inside(machine: RealSystemd) -> list[str]:
    return ["nsenter", "-t", str(machine.pid1), "-a", "--"]


def replayed_inside(machine: RealSystemd, engine: ContainerEngine, name: str, args: Sequence[str], fake_driver: Path,
                    units_series: dict, cgroup: str, for_everyone: bool = False,
                    exporter: Sequence[str] = EXPORTER) -> None:
    """The replay as containers of `engine` inside `machine`, logging to its journald, read by an exporter
    inside (where the containers' pids are theirs): the units' series. `cgroup`: the systemd cgroup path of
    each container's process, a glob with `{id}` for its id (the layout the engine was to make, and did)."""
    with in_containers(engine, machine.shared / name, "journald", ["--journal.directory", "/run/log/journal", *args],
                       seen=machine.inside, for_everyone=for_everyone) as replay:
        for _, container, cid in replay.workloads.values():
            pid = engine.inspect(container, "{{.State.Pid}}")
            path = systemd_cgroup_path(machine.run("cat", f"/proc/{pid}/cgroup").stdout)
            assert fnmatch.fnmatchcase(path, cgroup.format(id=cid)), (path, cgroup)
        assert exporter_series(replay, machine.inside(machine.shared / fake_driver.name), printed=True,
                               command=[*inside(machine), *exporter]) == units_series


@pytest.fixture(scope="module")
def docker_service(machine: RealSystemd, engine_image: Path) -> Iterator[DockerService]:
    yield from started(DockerService(SHARED_INSIDE / "docker", inside(machine)), engine_image)


@pytest.fixture(scope="module")
def podman_inside(machine: RealSystemd, engine_image: Path) -> Iterator[Podman]:
    (machine.shared / "podman").mkdir()
    yield from started(Podman(SHARED_INSIDE / "podman", inside(machine), events_backend="journald"), engine_image)


@pytest.fixture(scope="module")
def rootless_podman(machine: RealSystemd, engine_image: Path) -> Iterator[Podman]:
    """A user's rootless Podman inside `machine`: the user's service manager running (lingering, as a login
    would start it), the storage on the shared directory (rootless overlay does not go on the overlay root)."""
    machine.run("useradd", "--create-home", "--uid", str(ROOTLESS_UID), ROOTLESS_USER)
    machine.run("loginctl", "enable-linger", ROOTLESS_USER)
    assert wait_for(lambda: machine.systemctl("is-active", f"user@{ROOTLESS_UID}.service", check=False).stdout.strip()
                    == "active", timeout=30, interval=0.2), f"user@{ROOTLESS_UID}.service did not start"
    # The booted systemd's /proc/sys is read-only (tests/realsystemd.py): no sysctls in the containers
    home = f"/home/{ROOTLESS_USER}"
    machine.write_file(f"{home}/.config/containers/containers.conf", "[containers]\ndefault_sysctls = []\n")
    machine.run("chown", "-R", ROOTLESS_USER, f"{home}/.config")
    machine.shared.chmod(0o755)  # the user reaches the shared directory, the image and the replay's files there
    image = machine.shared / engine_image.name
    shutil.copy(engine_image, image)
    image.chmod(0o644)
    storage = machine.shared / "rootless"
    storage.mkdir()
    os.chown(storage, ROOTLESS_UID, ROOTLESS_UID)
    as_user = [*inside(machine), "runuser", "-u", ROOTLESS_USER, "--", "env", f"HOME={home}",
               f"XDG_RUNTIME_DIR=/run/user/{ROOTLESS_UID}"]
    yield from started(Podman(machine.inside(storage), as_user, events_backend="journald", uid=ROOTLESS_UID),
                       machine.inside(image))


def test_docker_journald_containers_give_the_units_series(machine: RealSystemd, docker_service: DockerService,
                                                          fake_driver: Path, units_series: dict):
    """docker.service's journal entries (CONTAINER_NAME, from dockerd in docker.service), its containers' ends
    (config.v2.json) and its systemd cgroup driver's scopes (`docker-<id>.scope`) of real containers: every
    compared series of the units, with the same values."""
    replayed_inside(machine, docker_service, "docker-journald",
                    ["--journal.containers", "docker/*", "--path.docker", str(docker_service.data_root)],
                    fake_driver, units_series, "/system.slice/docker-{id}.scope")


def test_podman_journald_containers_give_the_units_series(machine: RealSystemd, podman_inside: Podman,
                                                          fake_driver: Path, units_series: dict):
    """conmon's journal entries (CONTAINER_NAME) and Podman's died events of real containers, their names from
    containers/storage: every compared series of the units, with the same values."""
    replayed_inside(machine, podman_inside, "podman-journald",
                    ["--journal.containers", "podman/*", "--path.podman", str(podman_inside.storage)],
                    fake_driver, units_series, "/libpod_parent/libpod-{id}")


def test_rootless_podman_journald_containers_give_the_units_series(machine: RealSystemd, rootless_podman: Podman,
                                                                   fake_driver: Path, units_series: dict):
    """A user's rootless Podman (its conmon's journal entries, its own storage, its containers below its
    user@UID.service, the cgroupfs manager's `podman-<pid>.scope/<id>`): every compared series of the units,
    under the user's own keys (`podman/<name>@uid<N>`)."""
    manager = f"/user.slice/user-{ROOTLESS_UID}.slice/user@{ROOTLESS_UID}.service"
    replayed_inside(machine, rootless_podman, "rootless-journald",
                    ["--journal.containers", "podman/*", "--path.podman", str(rootless_podman.storage)],
                    fake_driver, units_series, manager + "/user.slice/podman-*.scope/{id}",
                    for_everyone=True, exporter=EXPORTER_READING_USERS)
