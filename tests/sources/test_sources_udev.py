"""vllm_xpu_exporter.sources.udev through the real libudev, over a fake sysfs in private namespaces.

Each scenario runs a small Python program inside a SysfsNamespace (tests/fakesysfs.py) that prints
JSON; uevents are sent inside the namespace's own network namespace, so nothing reaches the host.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_xpu_exporter.sources.udev import is_drm_minor_name, pci_address_from_devpath
from fakesysfs import (
    PCI_CLASS_DISPLAY_OTHER,
    FakeGpu,
    FakeSysfs,
    SysfsNamespace,
    Uevent,
)
from taskslimit import TaskLimit

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ)

GPU_A = FakeGpu("0000:03:00.0", card=1, render=128)
# Behind a PCIe switch (root port, upstream and downstream port), as discrete Arc/Flex cards sit.
GPU_B = FakeGpu("0000:4d:00.0", card=2, render=129, driver="xe", device_id=0xE20B,
                bridges=("0000:00:1c.0", "0000:4b:00.0", "0000:4c:01.0"))
CARD_ONLY = FakeGpu("0000:05:00.0", card=3, render=None, pci_class=PCI_CLASS_DISPLAY_OTHER,
                    connectors=(), bridges=("0000:00:1d.0",))
HOTPLUGGED = FakeGpu("0000:07:00.0", card=4, render=130, bridges=("0000:00:1e.0",))

NODES_SCRIPT = """
import json
from vllm_xpu_exporter.sources.udev import UdevUnavailable, drm_nodes_by_pci
try:
    nodes = drm_nodes_by_pci()
except UdevUnavailable as error:
    print(json.dumps({"error": type(error).__name__, "message": str(error)}))
else:
    print(json.dumps({"nodes": {address: [n.card, n.render_node] for address, n in nodes.items()}}))
"""

WATCHER_SCRIPT = """
import json, logging, sys, threading
from vllm_xpu_exporter.sources.udev import DrmWatcher, drm_nodes_by_pci

logging.basicConfig(level=logging.DEBUG, format="log %(levelname)s %(name)s %(message)s")
sources = tuple(sys.argv[1].split(","))
fail_first = "fail-first" in sys.argv[2:]
calls = []

def on_change(action, pci_address):
    calls.append(action)
    if fail_first and len(calls) == 1:
        raise RuntimeError("the callback failed")
    nodes = {address: [n.card, n.render_node] for address, n in drm_nodes_by_pci().items()}
    print(json.dumps({"action": action, "pci": pci_address, "nodes": nodes}), flush=True)

watcher = DrmWatcher(on_change, sources=sources)
started = watcher.start()
print(json.dumps({"started": started, "sources": list(watcher.active_sources)}), flush=True)
threading.Event().wait()
"""


NODE_NAMES_SCRIPT = """
import json, logging, sys, threading
from vllm_xpu_exporter.sources.udev import DrmNodeNames

logging.basicConfig(level=logging.DEBUG, format="log %(levelname)s %(name)s %(message)s")
names = DrmNodeNames()

def failing(action, pci_address):
    raise RuntimeError("the first listener failed")

def reporting(action, pci_address):
    nodes = names.get(pci_address)
    print(json.dumps({"action": action, "pci": pci_address, "nodes": [nodes.card, nodes.render_node]}), flush=True)

names.subscribe(failing)
names.subscribe(reporting)
names.start()
names.start()  # a second user of the same source
nodes = names.get(sys.argv[1])
print(json.dumps({"started": True, "before": [nodes.card, nodes.render_node]}), flush=True)
threading.Event().wait()
"""

def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run_json(ns: SysfsNamespace, script: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = ns.run([sys.executable, "-c", script], env=env or ENV, cwd=REPO, timeout=30)
    assert result.returncode == 0, result.stderr
    (line,) = json_lines(result.stdout)
    return line


@pytest.fixture
def sysfs(tmp_path: Path) -> FakeSysfs:
    return FakeSysfs.create(tmp_path / "sys", [GPU_A, GPU_B, CARD_ONLY])


# --- pure helpers ----------------------------------------------------------------------------------


def test_drm_minor_names_are_cards_and_render_nodes_but_not_connectors() -> None:
    assert [name for name in ("card0", "card12", "renderD128", "card1-DP-1", "card1-eDP-2", "version",
                              "controlD64", "renderD") if is_drm_minor_name(name)] == ["card0", "card12", "renderD128"]


def test_pci_address_from_devpath_takes_the_nearest_pci_device_in_lower_case() -> None:
    assert pci_address_from_devpath(GPU_B.drm_devpath("card2")) == "0000:4d:00.0"
    assert pci_address_from_devpath("/devices/pci10000:e0/10000:E1:00.0/drm/renderD128") == "10000:e1:00.0"
    assert pci_address_from_devpath("/devices/platform/vgem/drm/card9") is None


def test_fake_udev_events_pass_libudevs_in_kernel_subsystem_devtype_and_tag_filters(sysfs: FakeSysfs) -> None:
    # udevadm installs a BPF filter on the subsystem/devtype hashes and the tag bloom of the header;
    # a header with a wrong hash or bloom is dropped by the kernel before libudev sees it.
    monitor = ["stdbuf", "-oL", "udevadm", "monitor", "--udev", "--subsystem-match=drm/drm_minor",
               "--tag-match=uaccess"]
    with SysfsNamespace(sysfs, monitor) as ns:
        ns.wait_for_output(lambda line: line.startswith("UDEV - "))
        for event in sysfs.add_uevents(GPU_A):
            ns.send_uevent(event)
        ns.wait_for_output(lambda line: "renderD128" in line)
        received = [line.split()[-2] for line in ns.output().splitlines() if line.startswith("UDEV  [")]
    assert received == [GPU_A.drm_devpath("card1"), GPU_A.drm_devpath("renderD128")]


# --- mapping ---------------------------------------------------------------------------------------


def test_drm_nodes_by_pci_maps_each_gpu_to_its_card_and_render_node(sysfs: FakeSysfs) -> None:
    with SysfsNamespace(sysfs) as ns:
        result = run_json(ns, NODES_SCRIPT)
    assert result == {"nodes": {
        "0000:03:00.0": ["card1", "renderD128"],
        "0000:05:00.0": ["card3", ""],
        "0000:4d:00.0": ["card2", "renderD129"],
    }}


def test_drm_nodes_by_pci_is_empty_when_there_is_no_gpu(tmp_path: Path) -> None:
    with SysfsNamespace(FakeSysfs.create(tmp_path / "sys")) as ns:
        assert run_json(ns, NODES_SCRIPT) == {"nodes": {}}


def test_drm_nodes_by_pci_raises_udev_unavailable_without_sysfs() -> None:
    with SysfsNamespace(None) as ns:
        result = run_json(ns, NODES_SCRIPT)
    assert result["error"] == "UdevUnavailable"
    assert "/sys" in result["message"] and "\n" not in result["message"]


def test_drm_nodes_by_pci_raises_udev_unavailable_when_libudev_cannot_be_loaded(sysfs: FakeSysfs) -> None:
    with SysfsNamespace(sysfs, hide_libudev=True) as ns:
        result = run_json(ns, NODES_SCRIPT)
    assert result["error"] == "UdevUnavailable"
    assert "libudev" in result["message"] and "\n" not in result["message"]


def test_drm_nodes_by_pci_raises_udev_unavailable_when_libudev_refuses_the_sysfs(sysfs: FakeSysfs) -> None:
    # Without SYSTEMD_DEVICE_VERIFY_SYSFS=0 libudev accepts only device paths on a real sysfs.
    with SysfsNamespace(sysfs) as ns:
        result = run_json(ns, NODES_SCRIPT, env={**ENV, "SYSTEMD_DEVICE_VERIFY_SYSFS": "1"})
    assert result["error"] == "UdevUnavailable"
    assert "card1" in result["message"] and "\n" not in result["message"]


# --- watching --------------------------------------------------------------------------------------


@pytest.fixture
def watcher_ns(sysfs: FakeSysfs, request: pytest.FixtureRequest) -> Iterator[SysfsNamespace]:
    arguments = getattr(request, "param", ["kernel,udev"])
    with SysfsNamespace(sysfs, [sys.executable, "-c", WATCHER_SCRIPT, *arguments], env=ENV, cwd=REPO) as ns:
        started = json.loads(ns.wait_for_output(lambda line: line.startswith('{"started"')))
        assert started == {"started": True, "sources": ["kernel", "udev"]}, ns.output()
        yield ns


def events_until(ns: SysfsNamespace, action: str, pci: str | None) -> list[tuple[str, str | None]]:
    """The (action, pci) the watcher reported, up to and including the first `action` on `pci`."""
    ns.wait_for_output(lambda line: line.startswith("{") and json.loads(line).get("action") == action
                       and json.loads(line).get("pci") == pci)
    events = [(line["action"], line["pci"]) for line in json_lines(ns.output()) if "action" in line]
    return events[:events.index((action, pci)) + 1]


def reported(ns: SysfsNamespace, action: str, pci: str) -> dict[str, Any]:
    return next(line for line in json_lines(ns.output()) if line.get("action") == action and line.get("pci") == pci)


@pytest.mark.parametrize("kind", ["udev", "kernel"])
def test_watcher_reports_a_hotplugged_gpu_and_its_removal(watcher_ns: SysfsNamespace, kind: str) -> None:
    new = HOTPLUGGED.pci_address
    watcher_ns.hotplug_add(HOTPLUGGED, kind)  # type: ignore[arg-type]
    # pci add, card add, render add, driver bind; the connector is not reported
    assert events_until(watcher_ns, "bind", new) == [("add", new)] * 3 + [("bind", new)]
    assert reported(watcher_ns, "add", new)["nodes"][new] == ["card4", "renderD130"]

    watcher_ns.hotplug_remove(HOTPLUGGED, kind)  # type: ignore[arg-type]
    events = events_until(watcher_ns, "unbind", new)
    assert events[4:] == [("remove", new), ("remove", new), ("unbind", new)]
    assert new not in reported(watcher_ns, "unbind", new)["nodes"]
    assert set(reported(watcher_ns, "unbind", new)["nodes"]) == {"0000:03:00.0", "0000:05:00.0", "0000:4d:00.0"}


def test_watcher_ignores_connectors_and_pci_devices_that_are_not_displays(watcher_ns: SysfsNamespace) -> None:
    nic = Uevent("bind", "/devices/pci0000:00/0000:00:19.0", "pci",
                 FakeSysfs.pci_properties("0000:00:19.0", "e1000e", 0x020000, 0x8086, 0x15BB))
    connector_hotplug = Uevent("change", GPU_A.drm_devpath("card1-DP-1"), "drm", {"DEVTYPE": "drm_connector"})
    unbind = Uevent("unbind", GPU_B.devpath, "pci", FakeSysfs.gpu_pci_properties(GPU_B))
    card_change = Uevent("change", GPU_A.drm_devpath("card1"), "drm",
                         {**FakeSysfs.drm_properties(GPU_A, "card1"), "HOTPLUG": "1"})
    for event in (nic, connector_hotplug, unbind, card_change):
        watcher_ns.send_uevent(event)
    assert events_until(watcher_ns, "change", "0000:03:00.0") == [("unbind", "0000:4d:00.0"),
                                                                 ("change", "0000:03:00.0")]


def test_watcher_reports_a_uevent_heard_twice_with_one_seqnum_once(watcher_ns: SysfsNamespace) -> None:
    # udevd re-broadcasts the kernel's uevent with the kernel's SEQNUM; both sources hear it.
    card_change = Uevent("change", GPU_A.drm_devpath("card1"), "drm", FakeSysfs.drm_properties(GPU_A, "card1"))
    render_change = Uevent("change", GPU_B.drm_devpath("renderD129"), "drm",
                           FakeSysfs.drm_properties(GPU_B, "renderD129"))
    watcher_ns.send_uevent(card_change, seqnum=4242)
    watcher_ns.send_uevent(card_change, seqnum=4242)
    watcher_ns.send_uevent(render_change, seqnum=4243)
    assert events_until(watcher_ns, "change", "0000:4d:00.0") == [("change", "0000:03:00.0"),
                                                                 ("change", "0000:4d:00.0")]


@pytest.mark.parametrize("watcher_ns", [["kernel,udev", "fail-first"]], indirect=True)
def test_watcher_keeps_watching_after_the_callback_raises(watcher_ns: SysfsNamespace) -> None:
    first = Uevent("change", GPU_A.drm_devpath("card1"), "drm", FakeSysfs.drm_properties(GPU_A, "card1"))
    second = Uevent("change", GPU_B.drm_devpath("card2"), "drm", FakeSysfs.drm_properties(GPU_B, "card2"))
    watcher_ns.send_uevent(first)
    watcher_ns.wait_for_output(lambda line: "the callback failed" in line)
    watcher_ns.send_uevent(second)
    assert events_until(watcher_ns, "change", "0000:4d:00.0") == [("change", "0000:4d:00.0")]
    assert "GPU change callback failed for change 0000:03:00.0" in watcher_ns.output()


@pytest.mark.parametrize(("udev_control", "sources", "expected"), [
    (False, "udev", {"started": False, "sources": []}),
    (False, "kernel,udev", {"started": True, "sources": ["kernel"]}),
    (True, "udev", {"started": True, "sources": ["udev"]}),
])
def test_libudev_disables_the_udev_monitor_without_udevd_where_dev_is_not_devtmpfs(
        sysfs: FakeSysfs, udev_control: bool, sources: str, expected: dict[str, Any]) -> None:
    command = [sys.executable, "-c", WATCHER_SCRIPT, sources]
    with SysfsNamespace(sysfs, command, udev_control=udev_control, devtmpfs=False, env=ENV, cwd=REPO) as ns:
        started = json.loads(ns.wait_for_output(lambda line: line.startswith('{"started"')))
        warnings = [line for line in ns.output().splitlines() if line.startswith("log WARNING")]
    assert started == expected
    if expected["started"]:
        assert warnings == []
    else:
        assert len(warnings) == 1 and "udevd does not seem to run" in warnings[0]


def test_watcher_start_returns_false_with_one_warning_when_no_socket_can_be_opened() -> None:
    script = """
import json, logging, os, resource
import pyudev
from vllm_xpu_exporter.sources.udev import DrmWatcher

records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))
logging.getLogger("vllm_xpu_exporter.udev").addHandler(Keep())
logging.getLogger("vllm_xpu_exporter.udev").setLevel(logging.DEBUG)
context = pyudev.Context()
highest_fd = max(int(fd) for fd in os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (highest_fd + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
watcher = DrmWatcher(lambda action, pci: None, context=context)
print(json.dumps({"started": watcher.start(), "running": watcher.running, "records": records}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, cwd=REPO,
                            timeout=30, check=True)
    (outcome,) = json_lines(result.stdout)
    assert outcome["started"] is False and outcome["running"] is False
    warnings = [message for level, message in outcome["records"] if level == "WARNING"]
    assert len(warnings) == 1 and "Too many open files" in warnings[0]


def test_namespace_serves_http_on_its_own_loopback_only(tmp_path: Path) -> None:
    # How the exporter is run over a fake sysfs: started inside, scraped from inside, unseen outside.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "metrics").write_text("xpu_up 1\n")
    server = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    scrape = f"""
import time, urllib.request
for _ in range(100):
    try:
        print(urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=1).read().decode(), end="")
        break
    except OSError:
        time.sleep(0.05)
"""
    with SysfsNamespace(FakeSysfs.create(tmp_path / "sys"), server) as ns:
        assert ns.run([sys.executable, "-c", scrape]).stdout == "xpu_up 1\n"
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=1):
            pass


def test_watcher_start_returns_false_with_one_warning_when_no_thread_can_be_started(task_limit: TaskLimit) -> None:
    """Under a task limit (a pids cgroup, as systemd's TasksMax=) the watcher's thread cannot start (EAGAIN)."""
    script = """
import json, logging, os, sys
import pyudev
from vllm_xpu_exporter.sources.udev import DrmWatcher

records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))
logging.getLogger("vllm_xpu_exporter.udev").addHandler(Keep())
logging.getLogger("vllm_xpu_exporter.udev").setLevel(logging.DEBUG)
context = pyudev.Context()  # finding libudev runs ldconfig: before the limit
open_fds = len(os.listdir("/proc/self/fd"))
with open(sys.argv[1], "w") as pids_max:
    pids_max.write("1")  # no task beyond this process
watcher = DrmWatcher(lambda action, pci: None, context=context, sources=("kernel",))
print(json.dumps({"started": watcher.start(), "running": watcher.running, "records": records,
                  "fds_left_open": len(os.listdir("/proc/self/fd")) - open_fds}))
"""
    result = subprocess.run(task_limit.wrap([sys.executable, "-c", script, str(task_limit.path / "pids.max")]),
                            capture_output=True, text=True, env=ENV, cwd=REPO, timeout=30)
    assert result.returncode == 0, result.stderr
    (outcome,) = json_lines(result.stdout)
    assert outcome["started"] is False and outcome["running"] is False
    warnings = [message for level, message in outcome["records"] if level == "WARNING"]
    assert len(warnings) == 1 and "cannot start the watcher thread: can't start new thread" in warnings[0], outcome
    assert outcome["fds_left_open"] == 0, "the uevent socket and the stop pipe are closed again"


def test_drm_node_names_are_re_read_after_a_gpu_change_that_every_listener_hears(sysfs: FakeSysfs) -> None:
    new = HOTPLUGGED.pci_address
    command = [sys.executable, "-c", NODE_NAMES_SCRIPT, new]
    with SysfsNamespace(sysfs, command, env=ENV, cwd=REPO) as ns:
        started = json.loads(ns.wait_for_output(lambda line: line.startswith('{"started"')))
        ns.hotplug_add(HOTPLUGGED)
        events = events_until(ns, "bind", new)
        bound = reported(ns, "bind", new)
        output = ns.output()
    assert started == {"started": True, "before": ["", ""]}
    assert events == [("add", new)] * 3 + [("bind", new)], "the failing listener costs the other one nothing"
    assert bound["nodes"] == ["card4", "renderD130"]
    assert output.count("the first listener failed") == 4
    assert output.count("watching GPU hot-plug events") == 1, "started once for both users"
