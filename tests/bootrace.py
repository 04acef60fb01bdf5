"""The issue's boot race on a real systemd: three replayed vLLM units (chat 0.75, embedding 0.07, stt
0.07 of one 16 GiB GPU; tests/vllmunit.py) enabled in multi-user.target, so systemd starts them
together at boot, each with Restart=on-failure. One boot is booted, left to settle (every unit
serving) and read back from its journal (tests/journalfacts.py).

    outcome = race_boot(shared_dir)              # one boot, ~10 s
    outcome.failures, outcome.overlaps, outcome.counts["vllm-xpu-chat.service"]

`exec_start_pre` puts commands before each unit's engine (a gate, when there is one): the same for
every unit, or a function of the unit's engine (`gated`: the gate's client with the unit's R, as the
packaged drop-in runs it); `gate=packaged_gate(...)` installs the packaged gate service and socket,
seeing the fake GPU.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import journalfacts
from fakeze import SharedDevice
from polling import wait_for
from realsystemd import RealSystemd, path_inside
from scrapes import Samples, parse_samples
from vllmunit import CHAT, EMBEDDING, SIXTEEN_GIB_GPU, STT, Engine, read_events, serving_units, unit_file

RACE_UNITS: Mapping[str, Engine] = {
    "vllm-xpu-chat.service": CHAT,
    "vllm-xpu-embedding.service": EMBEDDING,
    "vllm-xpu-stt.service": STT,
}
SETTLE_TIMEOUT = 45.0
# In use on the idle GPU (the driver's own): a real GPU never reports free == total to root, and the
# gate takes free == total for untrusted accounting (and releases at once).
IDLE_RESERVED = 256 * 1024 * 1024


def budgeted(engine: Engine, budget: int) -> Engine:
    """The engine with --kv-cache-memory-bytes `budget` (its R unchanged: its footprint stays below R x total)."""
    return dataclasses.replace(engine, kv_cache_memory_bytes=budget)


# Each unit's KV budget: chat's one request of its full 131072 tokens, the small units' a few hundred MiB
# (their footprints, 11.75, 0.73 and 0.97 GiB, fit the 16 GiB GPU together).
PLANNED = {"vllm-xpu-chat.service": budgeted(CHAT, 131072 * 26624),
           "vllm-xpu-embedding.service": budgeted(EMBEDDING, 512 * 1024 * 1024),
           "vllm-xpu-stt.service": budgeted(STT, 300 * 1024 * 1024)}


def gate_command(*, timeout: str = "60s", extra: Sequence[str] = ()) -> str:
    """The ExecStartPre= of the packaged drop-in (packaging/vllm-xpu-gate.conf): the client `vllm-xpu-gate
    wait` (the console script beside this Python), no "+", as the unit's own user."""
    script = Path(sys.executable).with_name("vllm-xpu-gate")
    return " ".join([str(script), "wait", "--timeout", timeout, "--on-timeout", "start", *extra])


def gated(engine: Engine, extra: Sequence[str] = ()) -> list[str]:
    """The ExecStartPre= of a gated race unit: the client with the unit's own R, as docs/gate.md's drop-in
    advises, so the memory condition (free >= ceil(R x total)) is checked from the first start on (a
    fresh journal has no earlier start to take R from)."""
    return [gate_command(extra=["--gpu-memory-utilization", str(engine.gpu_memory_utilization), *extra])]


def gate_environment(shared: Path, fake_driver: Path) -> list[str]:
    """NAME=VALUE lines that make a Level Zero child load the fake driver (a copy in `shared`) with the
    race's device config, for the gate service's and the exporter's environment files: they see the GPU
    the replayed engines take memory from."""
    driver = path_inside(shared, fake_driver)
    config = path_inside(shared, Path(shared) / "ze.conf")
    return [f"ZE_ENABLE_ALT_DRIVERS={driver}", f"FAKE_ZE_CONFIG={config}", "ZES_ENABLE_SYSMAN=1"]


REPO = Path(__file__).resolve().parents[1]
EXPORTER_UNIT = "vllm-xpu-exporter.service"
GATE_SOCKET = "vllm-xpu-gate.socket"
GATE_SERVICE = "vllm-xpu-gate.service"
PACKAGED_PREFIX = "/opt/vllm-xpu-exporter/bin/"
PACKAGED_LISTEN = "--web.listen-address=:10447"


@dataclass(frozen=True)
class PackagedExporter:
    """packaging/vllm-xpu-exporter.service installed as /etc/systemd/system/vllm-xpu-exporter.service
    (race_boot's `exporter`: enabled beside the race units), adapted only where the namespace needs it:
    * ExecStart= runs this interpreter's `vllm-xpu-exporter` console script (the unit's
      /opt/vllm-xpu-exporter/bin/ replaced by the text);
    * /etc/default/vllm-xpu-exporter is the packaged one's flags (the default globs, vllm*.service), on
      127.0.0.1:<a free port> instead of :10447 (the namespace shares the host's network: a fixed port
      collides with other tests), plus --journal.directory=/run/log/journal (the namespace's journal is
      volatile), plus the fake Level Zero driver's variables (gate_environment's words);
    * a drop-in only when the unit's own sandboxing hides the interpreter or the checkout
      (showing_hidden_trees: a clone under /home, /root, /tmp or /var/tmp).
    Every other hardening setting stays as packaged (DynamicUser=, capabilities, ProtectSystem=strict,
    system call filter, MemoryDenyWriteExecute= ...)."""

    port: int
    files: Mapping[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def scrape(self, timeout: float = 5.0) -> Samples:
        """The exporter's metrics ({} while it does not answer)."""
        try:
            with urllib.request.urlopen(self.url, timeout=timeout) as response:
                return parse_samples(response.read().decode())
        except OSError:
            return {}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def packaged_exporter(shared: Path, fake_driver: Path, port: int | None = None) -> PackagedExporter:
    """The packaged exporter unit for race_boot (PackagedExporter); `fake_driver`: a copy in `shared`."""
    port = free_port() if port is None else port
    unit = (REPO / "packaging/vllm-xpu-exporter.service").read_text()
    if PACKAGED_PREFIX not in unit:
        raise ValueError(f"packaging/vllm-xpu-exporter.service runs no {PACKAGED_PREFIX}")
    unit = unit.replace(PACKAGED_PREFIX, f"{Path(sys.executable).parent}/")
    defaults = (REPO / "packaging/vllm-xpu-exporter.default").read_text()
    if PACKAGED_LISTEN not in defaults:
        raise ValueError(f"packaging/vllm-xpu-exporter.default has no {PACKAGED_LISTEN}")
    defaults = defaults.replace(PACKAGED_LISTEN, f"--web.listen-address=127.0.0.1:{port} "
                                                 "--journal.directory=/run/log/journal")
    defaults += "".join(f"{word}\n" for word in gate_environment(shared, fake_driver))
    files = {f"/etc/systemd/system/{EXPORTER_UNIT}": unit, "/etc/default/vllm-xpu-exporter": defaults}
    drop_in = showing_hidden_trees(unit, {str(REPO), sys.prefix, sys.base_prefix})
    if drop_in:
        files[f"/etc/systemd/system/{EXPORTER_UNIT}.d/realsystemd.conf"] = drop_in
    return PackagedExporter(port, files)


def hidden_trees_drop_in() -> str | None:
    """showing_hidden_trees for a unit of every setting that hides trees (ProtectHome=yes, PrivateTmp=yes): the
    drop-in that shows this checkout and its Python to a unit the test writes; None when nothing is hidden."""
    return showing_hidden_trees("ProtectHome=yes\nPrivateTmp=yes\n", {str(REPO), sys.prefix, sys.base_prefix}) or None


def packaged_gate(shared: Path, fake_driver: Path, flags: Sequence[str] = ()) -> dict[str, str]:
    """packaging/vllm-xpu-gate.socket and .service installed in /etc/systemd/system (path inside -> text),
    adapted only where the namespace needs it: ExecStart= runs this interpreter's console script,
    /etc/default/vllm-xpu-gate gives --journal.directory=/run/log/journal (the namespace's journal is
    volatile) and the fake Level Zero driver's variables (`fake_driver`: a copy in `shared`), and a
    drop-in shows the checkout where the hardening would hide it (hidden_trees_drop_in). `flags`: more
    flags of the service. Every hardening setting stays as packaged."""
    service = (REPO / "packaging" / GATE_SERVICE).read_text()
    if PACKAGED_PREFIX not in service:
        raise ValueError(f"packaging/{GATE_SERVICE} runs no {PACKAGED_PREFIX}")
    service = service.replace(PACKAGED_PREFIX, f"{Path(sys.executable).parent}/")
    arguments = " ".join(["--journal.directory=/run/log/journal", "--poll-interval=100ms", *flags])
    files = {f"/etc/systemd/system/{GATE_SERVICE}": service,
             f"/etc/systemd/system/{GATE_SOCKET}": (REPO / "packaging" / GATE_SOCKET).read_text(),
             "/etc/default/vllm-xpu-gate": f"VLLM_XPU_GATE_ARGS={arguments}\n"
                                           + "".join(f"{word}\n" for word in gate_environment(shared, fake_driver))}
    drop_in = hidden_trees_drop_in()  # DynamicUser=yes implies PrivateTmp=yes and ProtectHome=read-only
    if drop_in is not None:
        files[f"/etc/systemd/system/{GATE_SERVICE}.d/realsystemd.conf"] = drop_in
    return files


def packaged_drop_in_unit_section() -> str:
    """packaging/vllm-xpu-gate.conf's [Unit] section, as packaged (the [Service] section's ExecStartPre= is
    the tests' own, gate_command: this interpreter's client)."""
    text = (REPO / "packaging" / "vllm-xpu-gate.conf").read_text()
    section = text[text.index("[Unit]\n"):text.index("[Service]")]
    return "".join(line + "\n" for line in section.splitlines() if line and not line.startswith("#"))


def packaged_drop_in() -> dict[str, str]:
    """packaging/vllm-xpu-gate.conf's [Unit] lines for every race unit (a drop-in each; its ExecStartPre=
    is gate_command's, in the unit file)."""
    return {f"/etc/systemd/system/{unit}.d/vllm-xpu-gate.conf": packaged_drop_in_unit_section()
            for unit in RACE_UNITS}


# What the unit's sandboxing settings hide from its processes (systemd.exec(5)): PrivateTmp= gives it
# empty /tmp and /var/tmp of its own, ProtectHome=yes makes /home, /root and /run/user inaccessible.
HIDDEN_BY = {"PrivateTmp=yes": ("/tmp/", "/var/tmp/"), "ProtectHome=yes": ("/home/", "/root/", "/run/user/")}


def showing_hidden_trees(unit: str, trees: set[str]) -> str:
    """The drop-in that shows the unit the `trees` it runs from (the checkout, its virtual environment,
    the interpreter's prefix) which its own sandboxing hides: a clone in $HOME, /tmp or /var/tmp runs as
    one in /srv does. Read-only binds of exactly those trees (BindReadOnlyPaths=, with ProtectHome=tmpfs
    for home directories, systemd's documented way to show selected ones); every other setting stays as
    packaged. "" when nothing is hidden."""
    settings = {line.strip() for line in unit.splitlines()}
    prefixes = tuple(prefix for setting, hidden in HIDDEN_BY.items() if setting in settings for prefix in hidden)
    hidden = sorted(tree for tree in trees if tree.startswith(prefixes)) if prefixes else []
    hidden = [tree for tree in hidden if not any(tree.startswith(other + "/") for other in hidden)]
    if not hidden:
        return ""
    home = "ProtectHome=yes" in settings and any(tree.startswith(HIDDEN_BY["ProtectHome=yes"]) for tree in hidden)
    return "\n".join(["[Service]", *(["ProtectHome=tmpfs"] if home else []), "BindReadOnlyPaths=" + " ".join(hidden), ""])


@dataclass(frozen=True)
class BootOutcome:
    counts: Mapping[str, journalfacts.UnitCounts]  # per unit, as the journal shows it
    settled: bool  # every unit was serving before the timeout
    seconds: float  # from boot until every unit served (or the timeout)
    entries: Sequence[Mapping[str, object]]  # the units' journal (journalctl -o json)
    events: Sequence[Mapping[str, object]] = ()  # what the replayed engines wrote to --events (vllmunit)

    @property
    def failures(self) -> int:
        return sum(sum(unit.failures.values()) for unit in self.counts.values())

    @property
    def overlaps(self) -> int:
        return sum(unit.overlaps for unit in self.counts.values())


def race_unit_files(shared: Path, *, exec_start_pre: Sequence[str] | Callable[[Engine], Sequence[str]] = (),
                    time_scale: float = 0.1, extra_service: Sequence[str] = ()) -> dict[str, str]:
    """RACE_UNITS' unit files (path inside -> text): the engines take memory of `shared`/ze.conf and write
    their events to `shared`/events.jsonl."""
    shared = Path(shared)
    return {f"/etc/systemd/system/{name}": unit_file(
        engine, device_config=path_inside(shared, shared / "ze.conf"),
        exec_start_pre=exec_start_pre(engine) if callable(exec_start_pre) else exec_start_pre,
        time_scale=time_scale, events=path_inside(shared, shared / "events.jsonl"), requests=0,
        extra_service=extra_service)
        for name, engine in RACE_UNITS.items()}


def idle_gpu(shared: Path) -> tuple[Path, Path]:
    """A fresh 16 GiB fake GPU (`shared`/ze.conf, nothing held but the driver's IDLE_RESERVED) and no
    events yet (`shared`/events.jsonl): a cold boot's. Returns both paths."""
    config, events = Path(shared) / "ze.conf", Path(shared) / "events.jsonl"
    SharedDevice.create(config, SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    events.unlink(missing_ok=True)
    return config, events


def race_boot(shared: Path, *, exec_start_pre: Sequence[str] | Callable[[Engine], Sequence[str]] = (),
              time_scale: float = 0.1, extra_service: Sequence[str] = (), exporter: PackagedExporter | None = None,
              while_up: Callable[[RealSystemd], None] | None = None,
              files: Mapping[str, str] | None = None, gate: Mapping[str, str] | None = None) -> BootOutcome:
    """Boot once with RACE_UNITS enabled and report what the journal shows once they all serve.
    `extra_service`: more [Service] lines for every unit; `exporter`: the packaged exporter unit
    (packaged_exporter) enabled beside them; `while_up` is called with the machine once the units serve,
    before it shuts down; `files`: more files of the machine (path inside -> text), e.g. the units'
    drop-ins; `gate`: the packaged gate service's files (packaged_gate), its socket enabled."""
    shared = Path(shared)
    _, events = idle_gpu(shared)
    all_files = race_unit_files(shared, exec_start_pre=exec_start_pre, time_scale=time_scale,
                                extra_service=extra_service)
    all_files.update(files or {})
    enable = list(RACE_UNITS)
    if exporter is not None:
        all_files.update(exporter.files)
        enable.append(EXPORTER_UNIT)
    if gate is not None:
        all_files.update(gate)
        enable.append(GATE_SOCKET)
    with RealSystemd(shared, files=all_files, enable=enable) as machine:
        settled = wait_for(lambda: serving_units(events) == set(RACE_UNITS), timeout=SETTLE_TIMEOUT, interval=0.1)
        seconds = time.time() - machine.booted_at
        machine.sync_journal()
        entries = machine.journal(*RACE_UNITS)
        if while_up is not None:
            while_up(machine)
    return BootOutcome(journalfacts.counts(entries, RACE_UNITS), settled, seconds, entries, read_events(events))


__all__ = ["BootOutcome", "EXPORTER_UNIT", "GATE_SERVICE", "GATE_SOCKET", "PackagedExporter", "packaged_exporter",
           "IDLE_RESERVED", "RACE_UNITS", "gate_command", "gate_environment", "gated", "hidden_trees_drop_in",
           "idle_gpu", "packaged_drop_in", "packaged_gate", "race_boot", "race_unit_files", "showing_hidden_trees"]
