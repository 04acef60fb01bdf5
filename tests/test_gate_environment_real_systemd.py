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

Each planted piece, run as any other user than nobody, writes a marker file named after what planted it
into a directory of its own; as nobody (the client, the unit's main process: both load evil.so and
sitecustomize.py) it does nothing. The unit is gated the packaged drop-in's way (`ExecStartPre=...
vllm-xpu-gate wait`, no "+") beside the packaged gate service (tests/bootrace.py packaged_gate), on a
machine with a dynamically linked program at /bin/busybox and on one with no /bin/busybox: the packaging
runs no busybox, so neither changes anything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bootrace import GATE_SERVICE, GATE_SOCKET, IDLE_RESERVED, gated, hidden_trees_drop_in, packaged_gate
from fakeze import COMPILE_COMMAND, SharedDevice
from polling import wait_for
from realsystemd import RealSystemd, journal_field, path_inside
from test_real_systemd import require_root
from vllmunit import EMBEDDING, SIXTEEN_GIB_GPU

UNIT = "vllm-planted.service"
NOBODY = 65534
STEP_TIMEOUT = 30.0
DECISION = re.compile(r"^vllm-xpu-gate: (released|timed out) after ")

PLANTED_C = r"""
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void planted(void) {
    if (geteuid() == NOBODY)
        return;
    int fd = open(MARKERS "/" PLANTED_BY, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        (void)!write(fd, PLANTED_BY "\n", strlen(PLANTED_BY) + 1);
        close(fd);
    }
}
"""


def python_plant(markers: Path, planted_by: str) -> str:
    return (f"import os\nif os.geteuid() != {NOBODY}:\n"
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
                        f"-DNOBODY={NOBODY}", "-o", str(output), str(source)], check=True, capture_output=True,
                       text=True)

    compile_to(home / "evil.so", "LD_PRELOAD")
    compile_to(home / "alt-driver.so", "ZE_ENABLE_ALT_DRIVERS")
    for name in ("libze_loader.so.1", "libze_intel_gpu.so.1"):
        compile_to(home / "lib" / name, "LD_LIBRARY_PATH")
    systemctl = home / "bin" / "systemctl"
    systemctl.write_text(f'#!/bin/sh\nif [ "$(/usr/bin/id -u)" != {NOBODY} ]; then echo PATH > {markers_inside}/PATH; '
                         'fi\nexec /usr/bin/systemctl "$@"\n')
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


def start_planted_unit(shared: Path, fake_driver: Path, busybox: str | None
                       ) -> tuple[list[str], set[str], str, str, int | None]:
    """Boot with the packaged gate service and the planted unit gated by the packaged drop-in's client,
    `busybox` copied to /bin/busybox first (None: no /bin/busybox at all); start the unit and wait for its
    client's decision. The client's lines, the markers the plants wrote, the users of the unit's main
    process and of the gate service, and the uid that wrote the decision line."""
    markers, home = shared / "markers", shared / "home"
    markers.mkdir(mode=0o777)
    markers.chmod(0o777)  # any user may leave a marker: the plants tell who ran them
    plant(home, path_inside(shared, markers), path_inside(shared, home))
    shared.chmod(0o755)  # nobody reaches its directory (the shared directory is the namespace's /realsystemd)
    files = {f"/etc/systemd/system/{UNIT}": planted_unit(gated(EMBEDDING)[0], path_inside(shared, home)),
             f"/etc/systemd/system/{UNIT}.d/vllm-xpu-gate.conf": "[Unit]\nWants=vllm-xpu-gate.socket\n"
                                                                "After=vllm-xpu-gate.socket\n",
             **packaged_gate(shared, shared / fake_driver.name)}
    hidden = hidden_trees_drop_in()  # this Python, where nobody cannot reach it (/root)
    if hidden is not None:
        files[f"/etc/systemd/system/{UNIT}.d/realsystemd.conf"] = hidden
    with RealSystemd(shared, files=files, enable=[GATE_SOCKET]) as machine:
        machine.run("rm", "-f", "/bin/busybox", "/usr/bin/busybox")
        if busybox is not None:
            machine.run("cp", busybox, "/bin/busybox")
        machine.start(UNIT)

        def gate_entries() -> list[dict]:
            return [entry for entry in machine.journal(UNIT)
                    if (journal_field(entry, "MESSAGE") or "").startswith("vllm-xpu-gate: ")]

        assert wait_for(lambda: any(DECISION.match(journal_field(entry, "MESSAGE")) for entry in gate_entries()),
                        timeout=STEP_TIMEOUT, interval=0.2), f"no gate decision within {STEP_TIMEOUT} s"
        assert wait_for(lambda: machine.systemctl("is-active", UNIT, check=False).stdout.strip() == "active",
                        timeout=STEP_TIMEOUT, interval=0.2), machine.systemctl("status", UNIT, check=False).stdout
        user = machine.run("ps", "-o", "user=", "-p", machine.systemctl("show", "-P", "MainPID", UNIT).stdout.strip()
                           ).stdout.strip()
        service_user = machine.run("ps", "-o", "user=", "-p", machine.systemctl(
            "show", "-P", "MainPID", GATE_SERVICE).stdout.strip()).stdout.strip()
        entries = gate_entries()
    lines = [journal_field(entry, "MESSAGE") for entry in entries]
    decision = next(entry for entry in entries if DECISION.match(journal_field(entry, "MESSAGE")))
    uid = journal_field(decision, "_UID")
    return lines, {marker.name for marker in markers.iterdir()}, user, service_user, None if uid is None else int(uid)


@pytest.fixture
def shared(tmp_path: Path, fake_driver: Path) -> Path:
    require_root()
    shutil.copy(fake_driver, tmp_path / fake_driver.name)
    SharedDevice.create(tmp_path / "ze.conf", SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    return tmp_path


def dynamic_program() -> str:
    """A dynamically linked program of the host (as Debian's busybox package's /bin/busybox is)."""
    program = shutil.which("env") or "/usr/bin/env"
    headers = subprocess.run(["readelf", "--program-headers", "--wide", program], capture_output=True, text=True,
                             check=True).stdout
    assert "INTERP" in headers, f"{program} is not dynamically linked"
    return program


@pytest.mark.parametrize("busybox", ["dynamic /bin/busybox", "no busybox"])
def test_code_the_units_user_plants_runs_as_no_other_user(shared: Path, fake_driver: Path, busybox: str):
    """The client decides through the service (which saw the fake GPU: free is a figure), the unit's main
    process runs as nobody, the client's decision line was written by nobody, the service by a user of
    its own (not root), and no plant ran as any user but nobody: not the preload, the library path, the
    driver, the sitecustomize, the working directory's package nor the PATH's systemctl."""
    lines, markers, user, service_user, uid = start_planted_unit(
        shared, fake_driver, dynamic_program() if busybox.startswith("dynamic") else None)
    decision = next(line for line in lines if DECISION.match(line))
    assert decision.startswith("vllm-xpu-gate: released") and "free unknown" not in decision, lines
    assert user == "nobody" and uid == NOBODY, (user, uid)
    assert service_user not in ("root", "nobody", ""), service_user
    assert markers == set(), f"planted code ran as another user: {sorted(markers)}; the gate said {lines}"
