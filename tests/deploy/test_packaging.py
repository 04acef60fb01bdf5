"""The systemd unit (packaging/vllm-xpu-exporter.service): systemd 252 accepts it, its exposure stays below
3.0, it grants what the exporter needs and nothing else, and the exporter works inside its limits. The
init gate's service, socket and drop-in (packaging/vllm-xpu-gate.*): systemd 252 reads and accepts them,
the client runs as the unit's user (no prefix), and nothing runs busybox.

What is run for real here: `systemd-analyze verify` and `security --offline=true` (systemd 252), the
exporter under systemd 252's MemoryDenyWriteExecute= seccomp filter (rebuilt below, instruction for
instruction), and reads of another user's /proc/PID/fdinfo with exactly the unit's capabilities."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_xpu_exporter.cli import parse_options
from vllm_xpu_exporter.gate.cli import parse_client_options
from exporterproc import RunningExporter
from fakeprocfs import FakeProcfs, xe_fdinfo
from fakeze import A770, FakeConfig, fake_driver_env, write_config
from journalgen import Clock, random_boot_id, unit_output, unit_starting, write_journal
from polling import wait_for
from scrapes import sample
from sizes import GiB

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "packaging" / "vllm-xpu-exporter.service"
DEFAULTS = REPO / "packaging" / "vllm-xpu-exporter.default"
EXEC_START = "/opt/vllm-xpu-exporter/bin/vllm-xpu-exporter"
GATE_DROP_IN = REPO / "packaging" / "vllm-xpu-gate.conf"
GATE = "/opt/vllm-xpu-exporter/bin/vllm-xpu-gate"
GATE_SOCKET = REPO / "packaging" / "vllm-xpu-gate.socket"
GATE_SERVICE = REPO / "packaging" / "vllm-xpu-gate.service"
GATE_SOCKET_PATH = "/run/vllm-xpu-gate/gate.sock"
EXPOSURE_LIMIT = 3.0
CAP_BITS = {"CAP_DAC_READ_SEARCH": 2, "CAP_SYS_PTRACE": 19, "CAP_PERFMON": 38}


def unit_settings(text: str) -> dict[str, list[str]]:
    """Each directive of the unit with its values, in order (a directive may be given several times)."""
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def one(settings: dict[str, list[str]], key: str) -> str:
    values = settings.get(key)
    assert values and len(values) == 1, f"{key}= should be set once, is {values}"
    return values[0]


@pytest.fixture
def installed_unit(tmp_path: Path) -> Path:
    """The unit as installed: systemd-analyze checks that ExecStart's program exists, so it points at a
    real executable here instead of /opt/vllm-xpu-exporter."""
    program = tmp_path / "vllm-xpu-exporter"
    program.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m vllm_xpu_exporter \"$@\"\n")
    program.chmod(0o755)
    text = UNIT.read_text()
    assert f"ExecStart={EXEC_START} " in text
    unit = tmp_path / "vllm-xpu-exporter.service"
    unit.write_text(text.replace(f"ExecStart={EXEC_START} ", f"ExecStart={program} "))
    return unit


def analyze(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_COLORS": "0", **(env or {})})


def timespan_seconds(text: str) -> float:
    """A unit file's time span in seconds, as systemd reads it (`systemd-analyze timespan`)."""
    result = analyze("timespan", text)
    assert result.returncode == 0, result.stderr
    return int(re.search(r"μs: (\d+)", result.stdout).group(1)) / 1e6


def test_systemd_analyze_verify_accepts_the_unit(installed_unit):
    result = analyze("verify", str(installed_unit))
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr


def test_systemd_analyze_verify_accepts_the_socket_and_the_services_socket_drop_in(installed_unit):
    """packaging/vllm-xpu-exporter.socket beside the service, and the drop-in that makes the service take it
    (tests/real_systemd/test_exporter_socket_real_systemd.py boots them)."""
    socket_unit = installed_unit.with_name("vllm-xpu-exporter.socket")
    socket_unit.write_text((REPO / "packaging" / "vllm-xpu-exporter.socket").read_text())
    drop_in = installed_unit.with_name("vllm-xpu-exporter.service.d") / "socket.conf"
    drop_in.parent.mkdir()
    drop_in.write_text((REPO / "packaging" / "vllm-xpu-exporter-socket.conf").read_text())
    result = analyze("verify", str(socket_unit), str(installed_unit))
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr
    settings = unit_settings(drop_in.read_text())
    assert one(settings, "Environment") == "VLLM_XPU_EXPORTER_SOCKET=--web.systemd-socket"
    assert "$VLLM_XPU_EXPORTER_SOCKET" in one(unit_settings(UNIT.read_text()), "ExecStart")


def test_systemd_analyze_verify_reports_a_directive_systemd_does_not_know(installed_unit):
    """The check above can fail: a misspelt directive is reported."""
    installed_unit.write_text(installed_unit.read_text().replace("ProtectClock=yes", "ProtectClocks=yes"))
    result = analyze("verify", str(installed_unit))
    assert "ProtectClocks" in result.stdout + result.stderr


def test_security_exposure_is_below_three(installed_unit, record_property):
    result = analyze("security", "--offline=true", "--no-pager", str(installed_unit))
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    exposure = float(match[1])
    record_property("systemd_security_exposure", exposure)
    print(f"systemd-analyze security exposure of vllm-xpu-exporter.service: {exposure}")
    assert exposure < EXPOSURE_LIMIT, result.stdout
    satisfied = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("✓")}
    for setting in ("NoNewPrivileges=", "ProtectSystem=", "PrivateTmp=", "ProtectHome=", "User=/DynamicUser=",
                    "MemoryDenyWriteExecute=", "SystemCallArchitectures=", "SystemCallFilter=~@privileged",
                    "ProtectKernelTunables=", "ProtectKernelModules=", "ProtectControlGroups=",
                    "CapabilityBoundingSet=~CAP_SYS_ADMIN", "RestrictAddressFamilies=~AF_PACKET"):
        assert setting in satisfied, f"{setting} not satisfied:\n{result.stdout}"


def gated_unit(tmp_path: Path, drop_in: str) -> Path:
    """A vLLM unit of its own user with the gate's drop-in, as installed (the gate is a real program)."""
    program = tmp_path / "vllm-xpu-gate"
    program.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m vllm_xpu_exporter.gate \"$@\"\n")
    program.chmod(0o755)
    (tmp_path / "vllm-chat.service").write_text(
        "[Unit]\nDescription=vLLM chat\n[Service]\nExecStart=/bin/true\nDynamicUser=yes\n")
    (tmp_path / "vllm-chat.service.d").mkdir()
    assert GATE in drop_in
    (tmp_path / "vllm-chat.service.d" / "vllm-xpu-gate.conf").write_text(drop_in.replace(GATE, str(program)))
    for name in (GATE_SOCKET.name, GATE_SERVICE.name):
        (tmp_path / name).write_text((REPO / "packaging" / name).read_text().replace(GATE, str(program)))
    return tmp_path / "vllm-chat.service"


def test_systemd_analyze_verify_reads_and_accepts_the_gate_drop_in_service_and_socket(tmp_path):
    for name, drop_in in (("good", GATE_DROP_IN.read_text()),
                          ("misspelt", GATE_DROP_IN.read_text().replace("TimeoutStartSec=", "TimeoutStartSecs="))):
        (tmp_path / name).mkdir()
        unit = gated_unit(tmp_path / name, drop_in)
        result = analyze("verify", str(unit), str(unit.parent / GATE_SOCKET.name),
                         str(unit.parent / GATE_SERVICE.name),
                         env={"SYSTEMD_UNIT_PATH": f"{tmp_path / name}:"})  # ":": and the default path
        if name == "good":
            assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr
        else:  # so the drop-in was read
            assert "TimeoutStartSecs" in result.stdout + result.stderr


def test_the_drop_in_runs_the_client_as_the_units_user_within_the_units_start_timeout():
    settings = unit_settings(GATE_DROP_IN.read_text())
    command = one(settings, "ExecStartPre")
    assert not command.startswith(("+", "!", "-", "@", ":")), f"a prefix changes who runs the client: {command}"
    argv = shlex.split(command)
    assert argv[:2] == [GATE, "wait"]
    options = parse_client_options(argv[2:])
    assert options.request.start_on_timeout and options.socket_path == GATE_SOCKET_PATH
    assert timespan_seconds(one(settings, "TimeoutStartSec")) >= options.request.timeout + options.service_timeout + 90
    # The service is wanted beside the socket, so that it starts with the unit rather than at its client's
    # connection; the unit is ordered after the socket only (the client's connection waits in it).
    assert one(settings, "Wants").split() == [GATE_SOCKET.name, GATE_SERVICE.name]
    assert one(settings, "After") == GATE_SOCKET.name


# Exec*=+..., Exec*=!..., and Nix's ExecStartPre = [ "+..." ] or = mkAfter [ "+..." ]
PRIVILEGED_EXEC = re.compile(r"\bExec\w*\s*=[\s\"'\[]*(?:mk\w+[\s\"'\[]*)?[+!]")


def doc_examples(text: str) -> list[str]:
    """A Markdown document's example lines: indented code blocks and fenced ones."""
    examples, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith(("    ", "\t")):
            examples.append(line)
    return examples


def test_doc_examples_are_the_indented_and_fenced_lines():
    text = "prose ExecStartPre=+x\n\n    ExecStartPre=y\n```ini\nExecStart=z\n```\nafter\n"
    assert doc_examples(text) == ["    ExecStartPre=y", "ExecStart=z"]


def test_no_packaged_file_nix_file_or_doc_example_runs_busybox_or_a_plus_prefixed_command():
    """packaging/ and nix/ name no busybox at all and prefix no command with "+" or "!" (root, or no
    sandbox, in the unit's context); no example of docs/ does either (the prose may name the 0.2 shape)."""
    shipped = [*(REPO / "packaging").iterdir(), *(REPO / "nix").iterdir()]
    docs = sorted((REPO / "docs").rglob("*.md"))
    assert len(shipped) >= 7 and any(path.name == "module.nix" for path in shipped) and len(docs) >= 10
    for path in shipped:
        text = path.read_text()
        assert "busybox" not in text.lower(), path
        assert not PRIVILEGED_EXEC.search(text), (path, PRIVILEGED_EXEC.findall(text))
        assert not re.search(r'"\+\$\{', text), path  # a Nix string "+${...}" (a command, prefixed)
    for path in docs:
        examples = "\n".join(doc_examples(path.read_text()))
        assert "busybox" not in examples.lower(), path
        assert not PRIVILEGED_EXEC.search(examples), (path, PRIVILEGED_EXEC.findall(examples))


def test_the_check_for_privileged_commands_sees_each_form():
    for line in ("ExecStartPre=+/bin/busybox env -i x", "ExecStart=!/usr/bin/x", 'ExecStartPre = [ "+${gate}" ];',
                 "ExecStartPre = mkAfter [ \"!x\" ];"):
        assert PRIVILEGED_EXEC.search(line), line
    for line in ("ExecStartPre=/opt/vllm-xpu-exporter/bin/vllm-xpu-gate wait",
                 "ExecStartPre = mkAfter [ gateCommand ];", "ExecStart=-/bin/true"):
        assert not PRIVILEGED_EXEC.search(line), line


def test_the_socket_lets_any_local_process_connect_at_the_clients_default_path():
    settings = unit_settings(GATE_SOCKET.read_text())
    assert one(settings, "ListenStream") == GATE_SOCKET_PATH
    assert one(settings, "SocketMode") == "0666"


def test_the_gate_service_runs_as_a_dynamic_user_with_the_exporters_groups_and_capabilities_and_only_af_unix():
    gate, exporter = unit_settings(GATE_SERVICE.read_text()), unit_settings(UNIT.read_text())
    assert one(gate, "DynamicUser") == "yes" and "User" not in gate
    for key in ("SupplementaryGroups", "AmbientCapabilities", "CapabilityBoundingSet", "NoNewPrivileges",
                "ProtectSystem", "ProtectHome", "DevicePolicy"):
        assert one(gate, key) == one(exporter, key), key
    assert one(gate, "RestrictAddressFamilies") == "AF_UNIX"
    assert one(gate, "PrivateNetwork") == "yes"
    assert one(gate, "ExecStart").startswith(f"{GATE} serve ")


def test_the_gate_service_is_exposed_no_more_than_the_exporter(tmp_path):
    program = tmp_path / "vllm-xpu-gate"
    program.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m vllm_xpu_exporter.gate \"$@\"\n")
    program.chmod(0o755)
    unit = tmp_path / GATE_SERVICE.name
    unit.write_text(GATE_SERVICE.read_text().replace(GATE, str(program)))
    result = analyze("security", "--offline=true", "--no-pager", str(unit))
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match[1]) < EXPOSURE_LIMIT, result.stdout


def test_unit_grants_exactly_the_three_capabilities_as_ambient_and_bounding_set():
    settings = unit_settings(UNIT.read_text())
    ambient = set(one(settings, "AmbientCapabilities").split())
    assert ambient == set(CAP_BITS)
    assert set(one(settings, "CapabilityBoundingSet").split()) == ambient
    assert one(settings, "NoNewPrivileges") == "yes"


def test_unit_runs_as_a_dynamic_user_in_the_render_and_journal_groups():
    settings = unit_settings(UNIT.read_text())
    assert one(settings, "DynamicUser") == "yes"
    assert "User" not in settings
    assert set(one(settings, "SupplementaryGroups").split()) == {"render", "systemd-journal"}


def test_unit_keeps_proc_whole_and_opens_only_drm_devices():
    settings = unit_settings(UNIT.read_text())
    # Other units' /proc/PID/{fdinfo,cgroup} and /proc/meminfo must stay visible.
    assert one(settings, "ProtectProc") == "default"
    assert one(settings, "ProcSubset") == "all"
    # Capabilities in a user namespace would not count for the kernel's perfmon and ptrace checks.
    assert one(settings, "PrivateUsers") == "no"
    assert one(settings, "DevicePolicy") == "closed"
    assert settings["DeviceAllow"] == ["char-drm rw"]
    assert set(one(settings, "RestrictAddressFamilies").split()) == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}


def test_a_bad_configuration_is_not_restarted_in_a_loop():
    settings = unit_settings(UNIT.read_text())
    assert one(settings, "Restart") == "on-failure"
    assert one(settings, "RestartPreventExitStatus") == "2"


def test_default_file_flags_are_accepted_by_the_exporter():
    settings = unit_settings(DEFAULTS.read_text())
    # systemd unquotes the EnvironmentFile= value, then splits an unbraced $VAR on whitespace.
    arguments = [word for part in shlex.split(one(settings, "VLLM_XPU_EXPORTER_ARGS")) for word in part.split()]
    assert arguments
    parsed = parse_options(arguments)
    assert parsed.listen_addresses == (":10447",)
    assert "$VLLM_XPU_EXPORTER_ARGS" in one(unit_settings(UNIT.read_text()), "ExecStart")
    assert one(unit_settings(UNIT.read_text()), "EnvironmentFile") == "-/etc/default/vllm-xpu-exporter"


# --- MemoryDenyWriteExecute= ---------------------------------------------------------------------

# systemd 252, src/shared/seccomp-util.c, seccomp_memory_deny_write_execute(): on x86-64 it denies
# with EPERM mmap() asking for PROT_WRITE|PROT_EXEC, mprotect() and pkey_mprotect() asking for
# PROT_EXEC, and shmat() with SHM_EXEC.
MDWE_LAUNCHER = textwrap.dedent("""
    import ctypes, os, struct, sys

    AUDIT_ARCH_X86_64 = 0xC000003E
    NR_MMAP, NR_MPROTECT, NR_SHMAT, NR_PKEY_MPROTECT = 9, 10, 30, 329
    PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000
    LD_ABS, JEQ, AND, RET = 0x20, 0x15, 0x54, 0x06
    ALLOW, DENY = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    ARCH, NR, ARG2 = 4, 0, 16 + 2 * 8  # offsets in struct seccomp_data (low half of args[2])

    def program():
        code = [
            ("ld", ARCH), ("jeq", AUDIT_ARCH_X86_64, None, "allow"),
            ("ld", NR),
            ("jeq", NR_MMAP, "mmap", None), ("jeq", NR_MPROTECT, "mprotect", None),
            ("jeq", NR_PKEY_MPROTECT, "mprotect", None), ("jeq", NR_SHMAT, "shmat", None),
            ("ret", ALLOW),
            "mmap", ("ld", ARG2), ("and", PROT_WRITE | PROT_EXEC),
            ("jeq", PROT_WRITE | PROT_EXEC, "deny", "allow"),
            "mprotect", ("ld", ARG2), ("and", PROT_EXEC), ("jeq", PROT_EXEC, "deny", "allow"),
            "shmat", ("ld", ARG2), ("and", SHM_EXEC), ("jeq", SHM_EXEC, "deny", "allow"),
            "allow", ("ret", ALLOW),
            "deny", ("ret", DENY),
        ]
        labels, instructions = {}, []
        for item in code:
            if isinstance(item, str):
                labels[item] = len(instructions)
            else:
                instructions.append(item)
        def offset(label, index):
            return 0 if label is None else labels[label] - index - 1
        raw = b""
        for index, (op, k, *targets) in enumerate(instructions):
            if op == "jeq":
                raw += struct.pack("HBBI", JEQ, offset(targets[0], index), offset(targets[1], index), k)
            else:
                raw += struct.pack("HBBI", {"ld": LD_ABS, "and": AND, "ret": RET}[op], 0, 0, k)
        return raw, len(instructions)

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    raw, count = program()
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("HxxxxxxQ", count, ctypes.addressof(buffer))
    fprog_buffer = ctypes.create_string_buffer(fprog, len(fprog))
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.addressof(fprog_buffer), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the seccomp filter")
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
""")


def run_under_mdwe(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    launcher = tmp_path / "mdwe.py"
    launcher.write_text(MDWE_LAUNCHER)
    return subprocess.run([sys.executable, str(launcher), "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ))


def test_mdwe_filter_denies_writable_executable_memory(tmp_path):
    """The rebuilt filter does what systemd's does (else the test below would prove nothing)."""
    code = textwrap.dedent("""
        import mmap
        try:
            mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        except PermissionError:
            print("write+exec denied")
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        print("write allowed")
    """)
    result = run_under_mdwe(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["write+exec denied", "write allowed"]
    assert sys.platform == "linux" and os.uname().machine == "x86_64"


def test_ctypes_foreign_calls_and_callbacks_work_under_mdwe(tmp_path):
    """libffi closures (ctypes callbacks) need no writable+executable memory on this libffi."""
    code = textwrap.dedent("""
        import ctypes
        libc = ctypes.CDLL(None)
        values = (ctypes.c_int * 4)(3, 1, 2, 0)
        compare = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
        libc.qsort(values, 4, ctypes.sizeof(ctypes.c_int), compare(lambda a, b: a[0] - b[0]))
        print(list(values), libc.getpid() > 0)
    """)
    result = run_under_mdwe(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0, 1, 2, 3] True"


def test_exporter_collects_everything_under_memory_deny_write_execute(tmp_path, fake_driver, config_path):
    """The exporter, its Level Zero child (the real loader dlopening a driver), sd-journal and the fdinfo
    scan, all under MemoryDenyWriteExecute=yes."""
    write_config(config_path, FakeConfig(devices=(A770,)))
    procfs = FakeProcfs(tmp_path)
    procfs.add_unit_process(100, "/system.slice/vllm-chat.service").add_drm_fd(xe_fdinfo(client_id=1, vram0=2 * GiB))
    clock = Clock(random_boot_id())
    journal = write_journal(tmp_path / "units.journal", [
        unit_starting("vllm-chat.service", clock.tick()),
        unit_output("vllm-chat.service", "(APIServer pid=10) INFO 12-02 10:00:00 [api_server.py:1873] vLLM API "
                                         "server version 0.24.0", clock.tick()),
    ])
    launcher = tmp_path / "mdwe.py"
    launcher.write_text(MDWE_LAUNCHER)
    with RunningExporter(["--path.procfs", str(procfs.root), "--journal.file", str(journal), "--journal.boot", "all"],
                         env=fake_driver_env(fake_driver, config_path),
                         command=[sys.executable, str(launcher), "-m", "vllm_xpu_exporter"]) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and all(
            sample(s, "xpu_exporter_collector_success", collector=name) == 1
            for name in ("levelzero", "processes", "journal")) and s, timeout=20)
        status = Path(f"/proc/{exporter.process.pid}/status").read_text()
    assert samples, exporter.stderr
    assert re.search(r"^Seccomp:\s+2$", status, re.M), "the exporter ran under the seccomp filter"
    assert sample(samples, "xpu_memory_total_bytes", device="0000:03:00.0") == 16 * GiB
    assert sample(samples, "xpu_unit_memory_bytes", device="0000:03:00.0", unit="vllm-chat.service") == 2 * GiB


# --- the capabilities the processes collector needs ---------------------------------------------


@pytest.fixture
def other_users_process() -> Iterator[int]:
    """A process of another unprivileged user holding an open file, like a vLLM unit's engine."""
    process = subprocess.Popen(["setpriv", "--reuid=61001", "--regid=61001", "--clear-groups", "--",
                                "sleep", "60"], stdin=subprocess.PIPE)
    try:
        became_other_user = wait_for(lambda: re.search(r"^Uid:\s+61001\s", Path(f"/proc/{process.pid}/status").read_text(),
                                                       re.M), timeout=10)
        assert became_other_user
        yield process.pid
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


# The reads the processes collector makes of each process, in its order (exporter/sources/procfs.py):
# list /proc/PID/fd (a mode 0500 directory owned by the process's user), stat the device an fd's
# magic link points to, read /proc/PID/fdinfo/FD. Done with coreutils so that the reading program
# itself is reachable by any user.
FD_READS = (
    ("list fd", "ls /proc/{pid}/fd"),
    ("stat fd", "stat -L -c %F /proc/{pid}/fd/0"),
    ("read fdinfo", "cat /proc/{pid}/fdinfo/0"),
)


def fd_reads_as_service_user(pid: int, capabilities: set[str]) -> dict[str, bool]:
    """Which of FD_READS succeed for a non-root user with these ambient capabilities, a bounding set of
    the same and no_new_privs: the unit's process, as systemd starts it."""
    caps = ",".join(f"+{cap.removeprefix('CAP_').lower()}" for cap in sorted(capabilities))
    argv = ["setpriv", "--reuid=61000", "--regid=61000", "--clear-groups", "--no-new-privs",
            f"--bounding-set=-all{',' + caps if caps else ''}"]
    if caps:
        argv += [f"--inh-caps={caps}", f"--ambient-caps={caps}"]
    outcome = {}
    for name, command in FD_READS:
        result = subprocess.run([*argv, "--", "sh", "-c", command.format(pid=pid)], capture_output=True, text=True,
                                timeout=30)
        assert result.returncode == 0 or "Permission denied" in result.stderr, result.stderr
        outcome[name] = result.returncode == 0
    return outcome


def test_the_units_capabilities_let_it_read_other_users_fdinfo(other_users_process):
    capabilities = set(one(unit_settings(UNIT.read_text()), "AmbientCapabilities").split())
    assert fd_reads_as_service_user(other_users_process, capabilities) == {name: True for name, _ in FD_READS}


def test_without_capabilities_other_users_fds_are_closed_to_the_service(other_users_process):
    assert fd_reads_as_service_user(other_users_process, set()) == {name: False for name, _ in FD_READS}


@pytest.mark.parametrize(("missing", "denied"), [
    ("CAP_DAC_READ_SEARCH", "list fd"),  # the directory's mode 0500
    ("CAP_SYS_PTRACE", "stat fd"),       # following an fd's link and reading fdinfo need PTRACE_MODE_READ
])
def test_each_fdinfo_capability_is_needed(other_users_process, missing, denied):
    capabilities = set(one(unit_settings(UNIT.read_text()), "AmbientCapabilities").split()) - {missing}
    assert not fd_reads_as_service_user(other_users_process, capabilities)[denied]
