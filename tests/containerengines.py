"""Real container engines for tests: Debian 12's dockerd (docker.io 20.10, with the containerd it starts) and
rootful Podman (4.3, with runc and conmon), each private to the test run, and the test image built from Debian's
packages, so that nothing is pulled from an image registry.

    with Dockerd(tmp / "docker") as docker, Podman(tmp / "podman") as podman:
        docker.import_image(engine_image())
        docker.run("vllm-chat", ["python3", "-c", "print('hi')"])      # docker run -d ... IMAGE COMMAND
        docker.data_root                                                # --path.docker for the exporter

(`dockerd`, `podman` and `engine_image` are also session fixtures in tests/conftest.py.)

The image: `mmdebstrap --variant=apt --include=python3 bookworm`, from the machine's own apt sources, as a tar,
then `docker import` / `podman import`. Built once and kept in the cache directory (CACHE) under a key of
its inputs (the command line and the apt sources), so a run after the first imports it in a few seconds.

What each engine needs on this machine class (no systemd as PID 1, cgroup v1 controllers with a cgroup2
hierarchy beside them, no network but loopback), and why each setting:

* dockerd: its own socket, data root and exec root under a test directory (a second test run, or a dockerd of
  the machine's, is not disturbed); the cgroupfs cgroup driver (the systemd driver needs systemd on D-Bus:
  DockerService, docker.service in a booted systemd, has it);
  no bridge, no iptables rules, no masquerading (the containers run with `--network none`: nothing of the
  host's network is changed); overlay2 on the test directory's file system.
* Podman: its own storage root and run root; runc (crun refuses the hybrid cgroup layout), the cgroupfs
  manager, its events in a file (no journald on the host); every container with explicit
  `--ulimit nofile=...,nproc=...`, as Podman's defaults ask for limits above this machine's hard limits.
* Where a journald is needed (the journald log driver), the engines run inside a RealSystemd
  (tests/realsystemd.py): `DockerService` is Debian's docker.service there, `Podman` takes an nsenter `prefix`
  (and `runuser` for a rootless user).

Containers run with the host's pid namespace (`--pid host`), as deploy/compose.fake-gpu.yaml's stubs do, so
the pids a replayed engine (tests/vllmunit.py) records on the fake GPU are the host's and the exporter finds
their cgroups. A container is started detached and left to the engine's stop, which removes every container.

An engine that cannot start fails the test naming it (the suite fails on skips: tests/noskip.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

DOCKERD = "/usr/sbin/dockerd"
DOCKER = "/usr/bin/docker"  # Debian's client, whatever else a machine has on PATH
PODMAN = "/usr/bin/podman"
RUNC = "/usr/sbin/runc"
MMDEBSTRAP = "/usr/bin/mmdebstrap"
APT_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
IMAGE_COMMAND = (MMDEBSTRAP, "--quiet", "--variant=apt", "--include=python3", "bookworm")
IMAGE_NAME = "localhost/vllm-xpu-exporter-test:bookworm"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-xpu-exporter-tests"
START_TIMEOUT = 60.0
# Podman's default limits are the host's maxima, which this machine's hard limits are below
ULIMITS = ("nofile=4096:4096", "nproc=4096:4096")
# dockerd's settings, of Dockerd's daemon and of DockerService's docker.service alike (the module docstring)
DOCKERD_OPTIONS = ("--storage-driver", "overlay2", "--bridge", "none", "--iptables=false", "--ip-masq=false")


class EngineError(RuntimeError):
    """An engine that would not start or do what it was asked; the message names it and says why."""


def _run(argv: Sequence[str], what: str, timeout: float = 120.0, **kwargs) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                                stdin=kwargs.pop("stdin", subprocess.DEVNULL), **kwargs)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise EngineError(f"{what}: {' '.join(argv)}: {error}") from error
    if result.returncode != 0:
        raise EngineError(f"{what}: {' '.join(argv)} exited {result.returncode}: {result.stderr.strip()[-2000:]}")
    return result


def image_key() -> str:
    """The cached image's key: what it is built from."""
    inputs = "\0".join(IMAGE_COMMAND) + "\0" + (APT_SOURCES.read_text() if APT_SOURCES.exists() else "")
    return hashlib.sha256(inputs.encode()).hexdigest()[:16]


def engine_image(cache: Path = CACHE) -> Path:
    """The test image's root file system as a tar (Debian 12 with python3), built once per key and kept."""
    cache.mkdir(parents=True, exist_ok=True)
    tarball = cache / f"bookworm-python3-{image_key()}.tar"
    with open(cache / "image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run building the same image: wait for it
        if not tarball.exists():
            partial = tarball.with_name(tarball.stem + ".partial.tar")  # mmdebstrap: a tar by its name
            with open(APT_SOURCES) as sources:
                _run([*IMAGE_COMMAND, str(partial), "-"], "mmdebstrap (the test image)", timeout=600, stdin=sources)
            partial.rename(tarball)
    return tarball


def _unmount_below(directory: Path) -> None:
    """Unmount whatever an engine left mounted below `directory` (deepest first), so it can be removed."""
    prefix = str(directory.resolve()) + "/"
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for mountpoint in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", mountpoint], capture_output=True)


class _Engine:
    """What the engines share: a command line (after `prefix`, e.g. nsenter into a RealSystemd), the image,
    containers run detached."""

    name = ""
    image = IMAGE_NAME

    def __init__(self, base: Path, prefix: Sequence[str] = ()) -> None:
        self.base = Path(base)
        self.prefix = list(prefix)
        if not self.prefix:
            self.base.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> _Engine:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> _Engine:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def cli(self, *args: str, timeout: float = 120.0) -> str:
        """The engine's command line client with `args`; its output (EngineError naming the engine on failure)."""
        return _run([*self.command(), *args], self.name, timeout=timeout).stdout

    def import_image(self, tarball: Path) -> None:
        self.cli("import", str(tarball), self.image, timeout=300)

    def run_options(self) -> list[str]:
        return []

    def run(self, name: str, command: Sequence[str], *, log_driver: str, volumes: Sequence[Path] = (),
            options: Sequence[str] = ()) -> str:
        """Start a container detached with the host's pids and no network; `volumes` are bound at their own
        paths (read-write). Returns its id."""
        binds = [word for volume in volumes for word in ("-v", f"{volume}:{volume}")]
        return self.cli("run", "-d", "--name", name, "--network", "none", "--pid", "host", "--log-driver", log_driver,
                        *binds, *self.run_options(), *options, self.image, *command).strip()

    def inspect(self, name: str, template: str) -> str:
        return self.cli("inspect", "--format", template, name).strip()

    def remove(self, *names: str) -> None:
        """Remove these containers, running or not (a name not there is no error)."""
        present = set(self.cli("ps", "-a", "--format", "{{.Names}}").split())
        if present & set(names):
            self.cli("rm", "-f", *sorted(present & set(names)))

    def remove_all(self) -> None:
        ids = self.cli("ps", "-a", "-q").split()
        if ids:
            self.cli("rm", "-f", *ids)


class Dockerd(_Engine):
    """A dockerd of its own (and the containerd it starts) under `base`; see the module docstring."""

    name = "dockerd"

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.socket = self.base / "docker.sock"
        self.data_root = self.base / "root"
        self.exec_root = self.base / "exec"
        self.log = self.base / "dockerd.log"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [*self.prefix, DOCKER, "--host", f"unix://{self.socket}"]

    def start(self) -> Dockerd:
        with open(self.log, "ab") as log:
            try:
                self.process = subprocess.Popen(
                    [DOCKERD, "--host", f"unix://{self.socket}", "--data-root", str(self.data_root),
                     "--exec-root", str(self.exec_root), "--pidfile", str(self.base / "dockerd.pid"),
                     "--exec-opt", "native.cgroupdriver=cgroupfs", *DOCKERD_OPTIONS],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as error:
                raise EngineError(f"dockerd: {error} (tests/run installs Debian's docker.io)") from error
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise EngineError(f"dockerd exited {self.process.returncode}: {self._log_tail()}")
            if subprocess.run([*self.command(), "info"], capture_output=True).returncode == 0:
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise EngineError(f"dockerd did not answer within {START_TIMEOUT:.0f} s: {self._log_tail()}")
            time.sleep(0.2)

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(EngineError):
                self.remove_all()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None
        _unmount_below(self.base)
        shutil.rmtree(self.base, ignore_errors=True)


class Podman(_Engine):
    """Podman with its own storage under `base`; see the module docstring. `storage` is the exporter's
    --path.podman. Rootful by default; with a `prefix` such as `runuser -u USER -- env HOME=... XDG_RUNTIME_DIR=...`
    (and that user's `uid`), a user's rootless Podman."""

    name = "podman"

    def __init__(self, base: Path, prefix: Sequence[str] = (), events_backend: str = "file", uid: int = 0) -> None:
        """`events_backend`: "file" where no journald runs, "journald" (Podman's default on systemd hosts)
        where one does. `uid`: the user `prefix` runs Podman as (rootless), 0 for root."""
        super().__init__(base, prefix)
        self.events_backend = events_backend
        self.uid = uid
        self.storage = self.base / "storage"
        self.run_root = self.base / "run"
        self.tmp = self.base / "tmp"

    def command(self) -> list[str]:
        return [*self.prefix, PODMAN, "--root", str(self.storage), "--runroot", str(self.run_root), "--tmpdir",
                str(self.tmp), "--runtime", RUNC, "--cgroup-manager", "cgroupfs", "--events-backend",
                self.events_backend, "--storage-driver", "overlay"]

    def run_options(self) -> list[str]:
        return [word for limit in ULIMITS for word in ("--ulimit", limit)]

    def start(self) -> Podman:
        if not Path(PODMAN).exists():
            raise EngineError(f"podman: no {PODMAN} (tests/run installs Debian's podman)")
        self.cli("info")  # fails here, naming podman, if it cannot work on this machine
        return self

    def stop(self) -> None:
        with contextlib.suppress(EngineError):
            self.remove_all()
        if not self.prefix:  # inside a RealSystemd its mounts end with it
            _unmount_below(self.base)
            shutil.rmtree(self.base, ignore_errors=True)


class DockerService(_Engine):
    """Debian's docker.service (and containerd.service) as shipped, in a RealSystemd booted with them enabled
    and `docker_defaults(data_root)` as its /etc/default/docker: driven with Debian's client through nsenter,
    on the service's socket (/run/docker.sock). What dockerd sends to the journal (`--log-driver journald`)
    then comes from docker.service, as on a host."""

    name = "docker.service"

    def __init__(self, data_root: Path, prefix: Sequence[str]) -> None:
        super().__init__(data_root, prefix)
        self.data_root = self.base

    def command(self) -> list[str]:
        return [*self.prefix, DOCKER]

    def start(self, timeout: float = START_TIMEOUT) -> DockerService:
        deadline = time.monotonic() + timeout
        while subprocess.run([*self.command(), "info"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                status = subprocess.run([*self.prefix, "systemctl", "status", "--no-pager", "docker.service",
                                         "containerd.service"], capture_output=True, text=True).stdout
                raise EngineError(f"docker.service did not answer within {timeout:.0f} s: {status[-2000:]}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        with contextlib.suppress(EngineError):
            self.remove_all()


def docker_defaults(data_root: Path, cgroup_driver: str = "systemd") -> str:
    """/etc/default/docker for DockerService: the same settings as Dockerd's but the cgroup driver (systemd's
    by default: docker.service runs under a systemd), the data root where overlay2 works (not on the booted
    systemd's overlay root)."""
    return (f'DOCKER_OPTS="--data-root {data_root} --exec-opt native.cgroupdriver={cgroup_driver} '
            f'{" ".join(DOCKERD_OPTIONS)}"\n')


def started(engine: _Engine, image: Path) -> Iterator[_Engine]:
    """For a fixture: `engine` started with the test image imported, stopped (its containers removed) after.
    An engine that cannot start fails the test that asked for it, naming the engine."""
    try:
        engine.start()
        engine.import_image(image)
    except EngineError as error:
        engine.stop()
        pytest.fail(str(error))
    yield engine
    engine.stop()
