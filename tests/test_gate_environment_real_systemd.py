"""The gate runs as root with the gated unit's environment, which the unit's user may write: on a real
systemd 252 (tests/realsystemd.py), a unit with `User=nobody` whose `EnvironmentFile=` (nobody's)
points every variable that picks code at nobody's own directory, and whose `WorkingDirectory=` (also
nobody's) holds an `exporter/` package:

    PATH=<home>/bin:/usr/bin:/bin                 a planted `systemctl`
    PYTHONPATH=<home>/py                          a planted sitecustomize.py
    LD_PRELOAD=<home>/evil.so                     a shared object with a constructor
    LD_LIBRARY_PATH=<home>/lib                    libze_loader.so.1 and libze_intel_gpu.so.1 (a dlopen by bare name)
    ZE_ENABLE_ALT_DRIVERS=<home>/alt-driver.so    a "driver" for the Level Zero loader
    WorkingDirectory=<home>                       <home>/exporter/__init__.py (`python -m` imports it first)

Each planted piece, run as root (euid 0), writes a marker file named after what planted it into a
root-owned directory; as nobody (the unit's main process, /bin/sleep, loads evil.so too) it does nothing.

Gated the packaged drop-in's way (`+/bin/busybox env -i ... vllm-xpu-gate`, tests/bootrace.py
gate_command) no marker appears. Started directly (`+vllm-xpu-gate`, an older drop-in), LD_PRELOAD and
PYTHONPATH act on the gate's own interpreter before any of its code runs (the residual risk
docs/security.md names), while the gate's drop of the unit's environment keeps everything it runs (its
Level Zero child, systemctl) from the rest.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bootrace import IDLE_RESERVED, gate_command, gate_environment
from fakeze import COMPILE_COMMAND, SharedDevice
from polling import wait_for
from realsystemd import RealSystemd, journal_field, path_inside
from test_real_systemd import require_root
from vllmunit import EMBEDDING, SIXTEEN_GIB_GPU

UNIT = "vllm-planted.service"
NOBODY = 65534
STEP_TIMEOUT = 30.0
DECISION = re.compile(r"^vllm-xpu-gate: (released|timed out) after ")
PLANTED_BY_PRELOAD = {"LD_PRELOAD", "PYTHONPATH"}  # act on the gate's interpreter itself when started directly

PLANTED_C = r"""
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void planted(void) {
    if (geteuid() != 0)
        return;
    int fd = open(MARKERS "/" PLANTED_BY, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        (void)!write(fd, PLANTED_BY "\n", strlen(PLANTED_BY) + 1);
        close(fd);
    }
}
"""


def python_plant(markers: Path, planted_by: str) -> str:
    return (f"import os\nif os.geteuid() == 0:\n"
            f"    with open({str(markers / planted_by)!r}, 'w') as marker:\n"
            f"        marker.write({planted_by + chr(10)!r})\n")


def plant(home: Path, markers_inside: Path, home_inside: Path) -> Path:
    """nobody's directory with every plant in it (host path `home`, `home_inside` in the namespace);
    returns the EnvironmentFile (host path)."""
    (home / "bin").mkdir(parents=True)
    (home / "py").mkdir()
    (home / "lib").mkdir()
    (home / "vllm_xpu_exporter").mkdir()
    source = home / "planted.c"
    source.write_text(PLANTED_C)

    def compile_to(output: Path, planted_by: str) -> None:
        subprocess.run([*COMPILE_COMMAND, f'-DMARKERS="{markers_inside}"', f'-DPLANTED_BY="{planted_by}"',
                        "-o", str(output), str(source)], check=True, capture_output=True, text=True)

    compile_to(home / "evil.so", "LD_PRELOAD")
    compile_to(home / "alt-driver.so", "ZE_ENABLE_ALT_DRIVERS")
    for name in ("libze_loader.so.1", "libze_intel_gpu.so.1"):
        compile_to(home / "lib" / name, "LD_LIBRARY_PATH")
    systemctl = home / "bin" / "systemctl"
    systemctl.write_text(f'#!/bin/sh\nif [ "$(/usr/bin/id -u)" = 0 ]; then echo PATH > {markers_inside}/PATH; fi\n'
                         'exec /usr/bin/systemctl "$@"\n')
    systemctl.chmod(0o755)
    (home / "py" / "sitecustomize.py").write_text(python_plant(markers_inside, "PYTHONPATH"))
    (home / "vllm_xpu_exporter" / "__init__.py").write_text(python_plant(markers_inside, "WorkingDirectory"))
    environment = home / "environment"
    environment.write_text(f"PATH={home_inside}/bin:/usr/bin:/bin\n"
                           f"PYTHONPATH={home_inside}/py\n"
                           f"LD_PRELOAD={home_inside}/evil.so\n"
                           f"LD_LIBRARY_PATH={home_inside}/lib\n"
                           f"ZE_ENABLE_ALT_DRIVERS={home_inside}/alt-driver.so\n")
    for path in [home, *home.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    return environment


def planted_unit(gate: str, home_inside: Path) -> str:
    return "\n".join(["[Unit]", "Description=a vLLM unit whose user plants code", "", "[Service]",
                      "User=nobody", f"EnvironmentFile={home_inside}/environment", f"WorkingDirectory={home_inside}",
                      f"ExecStartPre={gate}", "ExecStart=/bin/sleep 300", ""])


def start_planted_unit(shared: Path, gate: str) -> tuple[list[str], set[str], str]:
    """Boot with the planted unit gated by `gate`, start it and wait for its gate's decision; the gate's
    lines, the markers the plants wrote, and the main process's user once it ran."""
    markers, home = shared / "markers", shared / "home"
    markers.mkdir(mode=0o755)
    plant(home, path_inside(shared, markers), path_inside(shared, home))
    shared.chmod(0o755)  # nobody reaches its directory (the shared directory is the namespace's /realsystemd)
    files = {f"/etc/systemd/system/{UNIT}": planted_unit(gate, path_inside(shared, home))}
    with RealSystemd(shared, files=files) as machine:
        machine.start(UNIT)

        def gate_lines() -> list[str]:
            messages = (journal_field(entry, "MESSAGE") or "" for entry in machine.journal(UNIT))
            return [message for message in messages if message.startswith("vllm-xpu-gate: ")]

        assert wait_for(lambda: any(DECISION.match(line) for line in gate_lines()), timeout=STEP_TIMEOUT,
                        interval=0.2), f"no gate decision within {STEP_TIMEOUT} s: {gate_lines()}"
        assert wait_for(lambda: machine.systemctl("is-active", UNIT, check=False).stdout.strip() == "active",
                        timeout=STEP_TIMEOUT, interval=0.2), machine.systemctl("status", UNIT, check=False).stdout
        main_pid = machine.systemctl("show", "-P", "MainPID", UNIT).stdout.strip()
        user = machine.run("ps", "-o", "user=", "-p", main_pid).stdout.strip()
        lines = gate_lines()
    return lines, {marker.name for marker in markers.iterdir()}, user


@pytest.fixture
def shared(tmp_path: Path, fake_driver: Path) -> Path:
    require_root()
    shutil.copy(fake_driver, tmp_path / fake_driver.name)
    SharedDevice.create(tmp_path / "ze.conf", SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    return tmp_path


def test_code_the_units_user_plants_never_runs_as_root_when_the_gate_starts_through_the_packaged_launcher(
        shared: Path, fake_driver: Path):
    """Gated `+/bin/busybox env -i <fake driver's variables> vllm-xpu-gate ...`: the gate decides (its
    Level Zero child saw the fake GPU: free is a figure), the unit's main process runs as nobody, and
    no plant ran as root: not the preload, the library path, the driver, the sitecustomize, the
    working directory's package nor the PATH's systemctl."""
    gate = gate_command(environment=gate_environment(shared, shared / fake_driver.name),
                        extra=["--gpu-memory-utilization", str(EMBEDDING.gpu_memory_utilization)])
    lines, markers, user = start_planted_unit(shared, gate)
    decision = next(line for line in lines if DECISION.match(line))
    assert decision.startswith("vllm-xpu-gate: released") and "free unknown" not in decision, lines
    assert user == "nobody"
    assert markers == set(), f"planted code ran as root: {sorted(markers)}; the gate said {lines}"
    assert not any("started with the unit's environment" in line for line in lines), lines


def test_without_the_launcher_the_preload_and_sitecustomize_run_as_root_but_nothing_the_gate_runs_loads_plants(
        shared: Path):
    """Gated `+vllm-xpu-gate ...` (no launcher): LD_PRELOAD and PYTHONPATH act on the gate's interpreter
    before its first line (the markers appear: the test above could fail), the gate warns that it has
    the unit's environment and drops it, so its Level Zero child loads neither the planted libraries
    (LD_LIBRARY_PATH) nor the planted driver (ZE_ENABLE_ALT_DRIVERS) nor the working directory's
    package, and systemctl is not the PATH's."""
    gate = gate_command(launcher=False, extra=["--gpu-memory-utilization", str(EMBEDDING.gpu_memory_utilization)])
    lines, markers, user = start_planted_unit(shared, gate)
    assert any(line.startswith("vllm-xpu-gate: released") for line in lines), lines
    assert any("started with the unit's environment" in line for line in lines), lines
    # Its Level Zero child ran (and, without the unit's variables, found no driver): the markers it
    # did not write are no accident of it not running.
    assert any("cannot read Level Zero" in line for line in lines), lines
    assert user == "nobody"
    assert markers == PLANTED_BY_PRELOAD, f"markers {sorted(markers)}; the gate said {lines}"
