"""The gate's client runs in the gated unit, as its user, with its environment, which the unit's user may
write: on a real systemd 252 (tests/realsystemd.py), a unit with `User=nobody` whose `EnvironmentFile=`
(nobody's) points every variable that picks code at nobody's own directory, and whose
`WorkingDirectory=` (also nobody's) holds a `vllm_xpu_exporter/` package:

    PATH=<home>/bin:/usr/bin:/bin                 a planted `systemctl`
    PYTHONPATH=<home>/py                          a planted sitecustomize.py
    LD_PRELOAD=<home>/evil.so                     a shared object with a constructor
    LD_LIBRARY_PATH=<home>/lib                    libze_loader.so.1 and libze_intel_gpu.so.1 (a dlopen by bare name)
    ZE_ENABLE_ALT_DRIVERS=<home>/alt-driver.so    a "driver" for the Level Zero loader
    WorkingDirectory=<home>                       <home>/vllm_xpu_exporter/__init__.py

Each planted piece, whenever it runs, leaves a marker named after what planted it and the effective uid
it ran as (`LD_PRELOAD.65534`) in a directory of its own. The unit is gated the packaged drop-in's way
(`ExecStartPre=... vllm-xpu-gate wait`, no "+") beside the packaged gate service (tests/bootrace.py
packaged_gate), in two boots of the same image: one with Debian's `busybox` package's /bin/busybox
(dynamically linked; checked, not assumed) visible in the booted system, one with every busybox hidden
from it. In both, the preload and the sitecustomize ran as nobody (the plants are live) and nothing ran
as anyone else.

A control unit in each boot starts a command the 0.2 drop-in's way (`ExecStartPre=+/bin/busybox env -i`,
as root, with the same EnvironmentFile=): with Debian's busybox the preload's constructor runs as root
(uid 0 leaves its marker), without busybox the start fails (203/EXEC). So each boot is the host it says
it is, and the markers would show a plant run as root.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from bootrace import (GATE_SERVICE, GATE_SOCKET, IDLE_RESERVED, gated, hidden_trees_drop_in,
                      packaged_drop_in_unit_section, packaged_gate)
from fakeze import COMPILE_COMMAND, SharedDevice
from polling import wait_for
from realsystemd import RealSystemd, journal_field, path_inside
from test_real_systemd import require_root
from vllmunit import EMBEDDING, SIXTEEN_GIB_GPU

UNIT = "vllm-planted.service"
CONTROL = "planted-as-root.service"  # the 0.2 drop-in's shape: "+" and busybox's env -i
BUSYBOX = "/bin/busybox"
BUSYBOX_PATHS = ("/bin/busybox", "/usr/bin/busybox", "/sbin/busybox", "/usr/sbin/busybox")
NOBODY = 65534
STEP_TIMEOUT = 30.0
DECISION = re.compile(r"^vllm-xpu-gate: (released|timed out) after ")
# The plants the gated unit's own processes load as nobody: the client's Python and the main process
# load the preload, the client's Python the sitecustomize. (The others are only ever loaded by something
# that reads Level Zero or calls systemctl, which nothing in the unit does: they must not run at all.)
LIVE_PLANTS = {f"LD_PRELOAD.{NOBODY}", f"PYTHONPATH.{NOBODY}"}

PLANTED_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void planted(void) {
    char path[4096], line[64];
    snprintf(path, sizeof path, "%s/%s.%u", MARKERS, PLANTED_BY, (unsigned)geteuid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        int length = snprintf(line, sizeof line, "%s %u\n", PLANTED_BY, (unsigned)geteuid());
        (void)!write(fd, line, (size_t)length);
        close(fd);
    }
}
"""


def python_plant(markers: Path, planted_by: str) -> str:
    return (f"import os\nwith open(f'{markers}/{planted_by}.{{os.geteuid()}}', 'w') as marker:\n"
            f"    marker.write(f'{planted_by} {{os.geteuid()}}\\n')\n")


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
    systemctl.write_text(f'#!/bin/sh\necho PATH > "{markers_inside}/PATH.$(/usr/bin/id -u)"\n'
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


def planted_unit(exec_start_pre: str, home_inside: Path, main: str = "/bin/sleep 300") -> str:
    return "\n".join(["[Unit]", "Description=a unit whose user plants code", "", "[Service]",
                      "User=nobody", f"EnvironmentFile={home_inside}/environment", f"WorkingDirectory={home_inside}",
                      f"ExecStartPre={exec_start_pre}", f"ExecStart={main}", ""])


def debian_dynamic_busybox(machine: RealSystemd) -> str:
    """What /bin/busybox is in the booted system, checked: Debian's `busybox` package's file (not
    busybox-static's), with an ELF interpreter (dynamically linked, so the loader honours LD_PRELOAD)."""
    owner = machine.run("dpkg-query", "--search", BUSYBOX, check=False)
    assert owner.returncode == 0 and owner.stdout.split(":")[0] == "busybox", (
        f"{BUSYBOX} is not Debian's busybox package's (tests/run installs it): {owner.stdout or owner.stderr}")
    version = machine.run("dpkg-query", "--show", "--showformat=${Version}", "busybox").stdout
    headers = machine.run("readelf", "--program-headers", "--wide", BUSYBOX).stdout
    interpreter = re.search(r"Requesting program interpreter: ([^\]]+)\]", headers)
    assert interpreter is not None, f"{BUSYBOX} (busybox {version}) is statically linked"
    return f"busybox {version}, interpreter {interpreter.group(1)}"


def hide_busybox(machine: RealSystemd) -> str:
    """Remove every busybox from the booted system's view (its root is an overlay: the host keeps its own)."""
    machine.run("rm", "-f", *BUSYBOX_PATHS)
    found = machine.run("sh", "-c", "command -v busybox || ls " + " ".join(BUSYBOX_PATHS), check=False)
    assert found.returncode != 0, f"a busybox is still there: {found.stdout}"
    return "no busybox"


def what_the_gate_did(machine: RealSystemd) -> str:
    """The gated unit's and the gate service's journals and states: what a failed wait is diagnosed from."""
    parts = []
    for unit in (UNIT, GATE_SOCKET, GATE_SERVICE):
        state = machine.systemctl("show", "-P", "ActiveState", unit, check=False).stdout.strip()
        lines = [journal_field(entry, "MESSAGE") or "" for entry in machine.journal(unit)]
        parts.append(f"{unit} ({state}):\n" + "\n".join(f"  {line}" for line in lines[-40:]))
    return "\n".join(parts)


@dataclass(frozen=True)
class PlantedBoot:
    busybox: str  # what the boot had: Debian's busybox's version and interpreter, or "no busybox"
    lines: list[str]  # the gated unit's client's lines
    markers: set[str]  # PLANTED_BY.EUID of every plant that ran while the gated unit started
    user: str  # the user of the gated unit's main process
    service_user: str  # the gate service's
    decision_uid: int | None  # the uid that wrote the client's decision line
    control_markers: set[str]  # the markers once the control unit (0.2's "+" busybox env -i) ran
    control_journal: list[str]  # the control unit's journal


def start_planted_unit(shared: Path, fake_driver: Path, with_busybox: bool) -> PlantedBoot:
    """Boot with the packaged gate service and the planted unit gated by the packaged drop-in's client,
    with the image's /bin/busybox or none; start the unit and wait for its client's decision, then start
    the control unit."""
    markers, home = shared / "markers", shared / "home"
    markers.mkdir(mode=0o777)
    markers.chmod(0o777)  # any user may leave a marker: the plants tell who ran them
    home_inside = path_inside(shared, home)
    plant(home, path_inside(shared, markers), home_inside)
    shared.chmod(0o755)  # nobody reaches its directory (the shared directory is the namespace's /realsystemd)
    files = {f"/etc/systemd/system/{UNIT}": planted_unit(gated(EMBEDDING)[0], home_inside),
             f"/etc/systemd/system/{UNIT}.d/vllm-xpu-gate.conf": packaged_drop_in_unit_section(),
             f"/etc/systemd/system/{CONTROL}": planted_unit(f"+{BUSYBOX} env -i /bin/true", home_inside,
                                                            main="/bin/true"),
             **packaged_gate(shared, shared / fake_driver.name)}
    hidden = hidden_trees_drop_in()  # this Python, where nobody cannot reach it (/root)
    if hidden is not None:
        files[f"/etc/systemd/system/{UNIT}.d/realsystemd.conf"] = hidden
    with RealSystemd(shared, files=files, enable=[GATE_SOCKET]) as machine:
        busybox = debian_dynamic_busybox(machine) if with_busybox else hide_busybox(machine)
        machine.start(UNIT)

        def gate_entries() -> list[dict]:
            return [entry for entry in machine.journal(UNIT)
                    if (journal_field(entry, "MESSAGE") or "").startswith("vllm-xpu-gate: ")]

        assert wait_for(lambda: any(DECISION.match(journal_field(entry, "MESSAGE")) for entry in gate_entries()),
                        timeout=STEP_TIMEOUT, interval=0.2), (
            f"no gate decision within {STEP_TIMEOUT} s:\n{what_the_gate_did(machine)}")
        assert wait_for(lambda: machine.systemctl("is-active", UNIT, check=False).stdout.strip() == "active",
                        timeout=STEP_TIMEOUT, interval=0.2), machine.systemctl("status", UNIT, check=False).stdout
        user = machine.run("ps", "-o", "user=", "-p", machine.systemctl("show", "-P", "MainPID", UNIT).stdout.strip()
                           ).stdout.strip()
        service_user = machine.run("ps", "-o", "user=", "-p", machine.systemctl(
            "show", "-P", "MainPID", GATE_SERVICE).stdout.strip()).stdout.strip()
        entries = gate_entries()
        planted = {marker.name for marker in markers.iterdir()}
        machine.systemctl("start", CONTROL, check=False)
        control_journal = [journal_field(entry, "MESSAGE") or "" for entry in machine.journal(CONTROL)]
    lines = [journal_field(entry, "MESSAGE") for entry in entries]
    decision = next(entry for entry in entries if DECISION.match(journal_field(entry, "MESSAGE")))
    uid = journal_field(decision, "_UID")
    return PlantedBoot(busybox, lines, planted, user, service_user, None if uid is None else int(uid),
                       {marker.name for marker in markers.iterdir()}, control_journal)


@pytest.fixture
def shared(tmp_path: Path, fake_driver: Path) -> Path:
    require_root()
    shutil.copy(fake_driver, tmp_path / fake_driver.name)
    SharedDevice.create(tmp_path / "ze.conf", SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    return tmp_path


@pytest.mark.parametrize("busybox", ["Debian's dynamic /bin/busybox", "no busybox"])
def test_code_the_units_user_plants_runs_as_no_other_user(shared: Path, fake_driver: Path, busybox: str):
    """The client decides through the service (which saw the fake GPU: free is a figure), the unit's main
    process runs as nobody, the client's decision line was written by nobody, the service by a user of
    its own (not root), and no plant ran as any user but nobody: not the preload, the library path, the
    driver, the sitecustomize, the working directory's package nor the PATH's systemctl. The control
    shows what the boot's busybox (or its absence) did to the 0.2 shape."""
    boot = start_planted_unit(shared, fake_driver, with_busybox=busybox != "no busybox")
    decision = next(line for line in boot.lines if DECISION.match(line))
    assert decision.startswith("vllm-xpu-gate: released") and "free unknown" not in decision, boot.lines
    assert boot.user == "nobody" and boot.decision_uid == NOBODY, (boot.user, boot.decision_uid)
    assert boot.service_user not in ("root", "nobody", ""), boot.service_user
    assert LIVE_PLANTS <= boot.markers, f"the plants did not run in the unit at all: {sorted(boot.markers)}"
    as_others = sorted(marker for marker in boot.markers if not marker.endswith(f".{NOBODY}"))
    assert as_others == [], (f"planted code ran as another user ({boot.busybox}): {as_others}; "
                             f"the gate said {boot.lines}")
    control = boot.control_markers - boot.markers
    if busybox == "no busybox":
        assert control == set() and any("203/EXEC" in line for line in boot.control_journal), boot.control_journal
    else:
        assert "LD_PRELOAD.0" in control, (boot.busybox, sorted(control), boot.control_journal)
