"""The dependency floors pyproject.toml declares are true: a venv holding exactly every floor (the runtime
dependencies and the test extras, from PyPI) passes the fast tier and the tests that drive the libraries the
fast tier does not reach (bcrypt, PyYAML, pyudev), and the release below each runtime floor fails (its tests,
or its install).

The floor venv is built once (under a lock: the suite's workers share it) and kept in .venv-floors/, rebuilt when the floors, the interpreter or the
checkout's path change (its .installed-from holds what it was built from, as tests/run does for npm's
modules). Not `fast`: it installs from PyPI and runs pytest in subprocesses (about two minutes on two loaded
cores, a rebuild of the venv some seconds more)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLOOR_VENV = REPO / ".venv-floors"
# The release below each runtime floor, and the tests that show it broken (None: it does not even install).
BELOW_FLOOR = {
    # Before 0.26 prometheus_client wrote float exponents with a leading zero (1.7179869184e+010): the
    # exposition, which writes Go's (and 0.26's) 1.7179869184e+10, is no longer prometheus_client's bytes.
    "prometheus-client": ("0.25.0", ["-m", "fast", "tests/http/test_http_exposition.py"]),
    # Neither imports on Python 3.11 (bcrypt's extension module; pyudev's `from collections import Container`).
    "bcrypt": ("3.1.3", ["tests/http/test_http_webconfig.py"]),
    "pyudev": ("0.21.0", ["tests/sources/test_sources_udev.py"]),
    # No wheel for Python 3.11, and its sources do not build with today's Cython (`cython_sources`).
    "PyYAML": ("5.4.1", None),
}
# The fast tier drives prometheus-client, pytest and hypothesis (and imports every test module, so every test
# extra); these drive the web config's bcrypt and PyYAML and udev's pyudev over real libudev.
LIBRARY_TESTS = ["tests/http/test_http_webconfig.py", "tests/sources/test_sources_udev.py"]
FLOOR = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)>=([0-9][0-9A-Za-z.]*)")


def declared_floors() -> dict[str, str]:
    """name -> floor of every dependency and test extra, each of which must be declared as `name>=floor`."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    floors = {}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        match = FLOOR.fullmatch(requirement.replace(" ", ""))
        assert match, f"{requirement!r} declares no floor of the form name>=version"
        floors[match[1]] = match[2]
    return floors


def pip(venv: Path, *args: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *args], check=True, cwd=REPO, stdout=subprocess.DEVNULL)


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


@pytest.fixture(scope="module")
def floor_venv() -> Path:
    pins = [f"{name}=={floor}" for name, floor in sorted(declared_floors().items())]
    built_from = hashlib.sha256(json.dumps([pins, sys.version, str(REPO)]).encode()).hexdigest()
    stamp = FLOOR_VENV / ".installed-from"
    with open(REPO / ".venv-floors.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker building it: wait, then find it built
        if not stamp.is_file() or stamp.read_text() != built_from:
            shutil.rmtree(FLOOR_VENV, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(FLOOR_VENV)], check=True)
            pip(FLOOR_VENV, *pins)
            pip(FLOOR_VENV, "--no-deps", "-e", str(REPO))
            stamp.write_text(built_from)
    return FLOOR_VENV


def installed(venv: Path) -> dict[str, str]:
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json",
                             "--disable-pip-version-check"], check=True, capture_output=True, text=True).stdout
    return {re.sub(r"[-_.]+", "-", package["name"]).lower(): package["version"] for package in json.loads(listed)}


def pytest_in(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=900)


def test_the_floor_venv_holds_exactly_the_declared_floors(floor_venv: Path):
    versions = installed(floor_venv)
    assert {name: versions.get(name.lower()) for name in declared_floors()} == declared_floors()


def test_the_fast_tier_passes_at_every_declared_floor(floor_venv: Path):
    run = pytest_in(floor_venv, "-m", "fast")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def test_the_web_config_and_udev_tests_pass_at_every_declared_floor(floor_venv: Path):
    run = pytest_in(floor_venv, *LIBRARY_TESTS)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


@pytest.mark.parametrize("name", sorted(BELOW_FLOOR))
def test_the_release_below_each_runtime_floor_fails(floor_venv: Path, name: str, tmp_path: Path):
    below_floor, tests = BELOW_FLOOR[name]
    assert below_floor != declared_floors()[name]
    # A venv of its own holding only the release below, in front of the floor venv's packages (pip among them: the
    # venv needs none of its own, whose bootstrap took seconds per venv).
    below = tmp_path / "below"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(below)], check=True)
    floor_packages = str(site_packages(floor_venv))
    (site_packages(below) / "floors.pth").write_text(f"import site; site.addsitedir({floor_packages!r})\n")
    if tests is None:  # found, and its build fails (not an index out of reach)
        install = subprocess.run([str(below / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                                  "--no-deps", f"{name}=={below_floor}"], cwd=REPO, capture_output=True, text=True)
        assert install.returncode != 0 and "subprocess-exited-with-error" in install.stderr, install.stderr[-2000:]
        return
    pip(below, "--no-deps", f"{name}=={below_floor}")
    version = subprocess.run([str(below / "bin" / "python"), "-c", "import importlib.metadata, sys; "
                              "print(importlib.metadata.version(sys.argv[1]))", name],
                             check=True, capture_output=True, text=True).stdout.strip()
    assert version == below_floor
    # The same tests pass at the floor (above); here they fail (1), or their module does not import (2).
    run = pytest_in(below, "-x", *tests)
    assert run.returncode in (1, 2) and (" failed" in run.stdout or " error" in run.stdout), run.stdout[-2000:]
