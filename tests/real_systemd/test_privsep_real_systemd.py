"""The packaged exporter's and gate's sandboxes on a real systemd 252 (tests/realsystemd.py): code running as the
service reads no root service's secret, and the exporter still reports per-unit memory from fdinfo.

Each service's unit is installed with every line as packaged but `ExecStart=`, which runs tests/privsepprobe.py
with this interpreter: `separate` does what the services' start-up does (the privileged reader started, then the
serving process's capabilities lowered) and then tries, as code in the serving process, to read a root service's
`/proc/PID/environ` (its DB_PASSWORD), its stack through `/proc/PID/mem`, and `/proc/PID/root/etc/shadow`;
`keep` tries the same with the packaged capabilities kept, as the services ran before. Beside them, the packaged
exporter itself (its real ExecStart=) reads a procfs tree whose fd tables are root's and mode 0500, as /proc
shows another user's process: only CAP_DAC_READ_SEARCH lists them, which only its reader keeps."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from bootrace import EXPORTER_UNIT, GATE_SERVICE, REPO, packaged_exporter, packaged_gate, showing_hidden_trees
from fakeprocfs import FakeProcfs, xe_fdinfo
from polling import wait_for
from realsystemd import RealSystemd, journal_field, path_inside
from scrapes import series
from test_gate_environment_real_systemd import shared  # noqa: F401  (a fixture: the fake driver and its device)

PROBE = Path(__file__).resolve().parents[1] / "privsepprobe.py"
SECRET_UNIT = "secret-holder.service"
SECRET = "hunter2-db-password"
STEP_TIMEOUT = 30.0
MiB = 1 << 20
CHAT_UNIT = "vllm-xpu-chat.service"


def probe_units(packaged: str, name: str, target: int, stack: str) -> dict[str, str]:
    """The packaged unit `packaged` (a file of packaging/) with ExecStart= running the probe, once per mode, and the
    drop-in that shows it this checkout and interpreter where its sandbox hides them."""
    text = (REPO / "packaging" / packaged).read_text()
    files = {}
    for mode in ("separate", "keep"):
        lines = [f"ExecStart={sys.executable} {PROBE} {mode} {target} {stack}" if line.startswith("ExecStart=")
                 else line for line in text.splitlines()]
        assert sum(line.startswith("ExecStart=") for line in lines) == 1
        unit = f"probe-{name}-{mode}.service"
        files[f"/etc/systemd/system/{unit}"] = "\n".join(lines) + "\n"
        drop_in = showing_hidden_trees(text, {str(REPO), sys.prefix, sys.base_prefix})
        if drop_in:
            files[f"/etc/systemd/system/{unit}.d/realsystemd.conf"] = drop_in
    return files


def probe_report(machine: RealSystemd, unit: str) -> dict:
    def messages() -> list[str]:
        return [str(journal_field(entry, "MESSAGE")) for entry in machine.journal(unit)]

    def finished() -> bool:  # its run ended: PID 1 said so (a queued start's unit is inactive before it runs too)
        return any(message.endswith("Deactivated successfully.") or "Failed with result" in message
                   for message in messages())

    machine.start(unit)
    done = wait_for(finished, timeout=STEP_TIMEOUT, interval=0.2)
    machine.sync_journal()
    assert done, f"{unit} did not finish:\n" + "\n".join(messages())
    reports = [json.loads(message) for message in messages() if message.startswith("{")]
    assert reports, "\n".join(messages())
    return reports[-1]


def test_code_in_the_packaged_services_reads_no_root_secret_and_the_exporter_still_reads_fdinfo(
        shared: Path, fake_driver: Path):
    tree = FakeProcfs(shared / "fakeproc")
    chat = tree.add_unit_process(4242, f"/system.slice/{CHAT_UNIT}")
    chat.add_drm_fd(xe_fdinfo(client_id=7, vram0=3 * MiB))
    for link in (tree.root / "4242" / "fd").iterdir():  # the fds' files as the booted system sees them
        target = os.readlink(link)
        link.unlink()
        link.symlink_to(path_inside(shared, target))
    chat.make_private()
    exporter = packaged_exporter(shared, shared / fake_driver.name)
    files = dict(exporter.files)
    defaults = "/etc/default/vllm-xpu-exporter"
    files[defaults] = files[defaults].replace(
        "--journal.directory=/run/log/journal",
        f"--journal.directory=/run/log/journal --path.procfs={path_inside(shared, tree.root)}")
    files[f"/etc/systemd/system/{SECRET_UNIT}"] = (
        f"[Service]\nEnvironment=DB_PASSWORD={SECRET}\nExecStart=/bin/sleep 600\n")
    files.update(packaged_gate(shared, shared / fake_driver.name))  # its socket, which the gate's unit requires
    with RealSystemd(shared, files=files) as machine:
        machine.start(SECRET_UNIT)
        pid = int(machine.systemctl("show", "-p", "MainPID", "--value", SECRET_UNIT).stdout)
        maps = machine.run("cat", f"/proc/{pid}/maps").stdout
        stack = next(line for line in maps.splitlines() if line.rstrip().endswith("[stack]")).split("-")[0]
        environ = machine.run("cat", f"/proc/{pid}/environ").stdout
        assert SECRET in environ  # what the probe must not read
        for files_of in (probe_units("vllm-xpu-exporter.service", "exporter", pid, stack),
                         probe_units(GATE_SERVICE, "gate", pid, stack)):
            for inside, text in files_of.items():
                machine.write_file(inside, text)
        machine.daemon_reload()
        reports = {unit: probe_report(machine, f"probe-{unit}.service")
                   for unit in ("exporter-keep", "exporter-separate", "gate-keep", "gate-separate")}

        machine.start(EXPORTER_UNIT)
        seen: dict[str, object] = {}

        def chat_memory() -> bool:
            seen["samples"] = samples = exporter.scrape()
            memory = series(samples, "xpu_unit_memory_bytes")
            return memory.get((("device", "0000:03:00.0"), ("unit", CHAT_UNIT))) == 3 * MiB

        found = wait_for(chat_memory, timeout=STEP_TIMEOUT, interval=0.5)
        lines = "\n".join(str(journal_field(entry, "MESSAGE")) for entry in machine.journal(EXPORTER_UNIT))
        main_pid = int(machine.systemctl("show", "-p", "MainPID", "--value", EXPORTER_UNIT).stdout)
        serving_caps = machine.run("grep", "^CapPrm", f"/proc/{main_pid}/status").stdout.split()[1]

    for name in ("exporter-keep", "gate-keep"):  # the packaged sandbox alone, as before the separation
        report = reports[name]
        assert (report["environ"], report["mem"], report["root_shadow"]) == ("ok", "ok", "ok"), (name, report)
    for name in ("exporter-separate", "gate-separate"):
        report = reports[name]
        assert (report["environ"], report["mem"], report["root_shadow"]) == ("EACCES", "EACCES", "EACCES"), \
            (name, report)
        assert report["caps"] == "0", (name, report)
        assert report["reader_unreadable"] < report["serving_unreadable"], (name, report)
    assert found, f"no per-unit memory from fdinfo: {series(seen.get('samples', {}), 'xpu_unit_memory_bytes')}\n{lines}"
    assert int(serving_caps, 16) == 0, lines
    # Level Zero, started by the reader with CAP_PERFMON, reads the fake GPU
    assert series(seen["samples"], "xpu_exporter_collector_success")[(("collector", "levelzero"),)] == 1, lines
