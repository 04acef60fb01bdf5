"""Socket activation of the packaged exporter on a real systemd 252 (tests/realsystemd.py): packaging/
vllm-xpu-exporter.socket and the service's drop-in packaging/vllm-xpu-exporter-socket.conf installed as the
socket's comment says, beside the packaged service (bootrace.packaged_exporter). systemd listens; the first
scrape starts the service, which serves systemd's socket (--web.systemd-socket, through the privilege
separation's re-execution) and binds nothing of its own."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

from bootrace import EXPORTER_UNIT, REPO, free_port, packaged_exporter
from polling import wait_for
from realsystemd import RealSystemd, journal_field
from scrapes import sample
from test_gate_environment_real_systemd import shared  # noqa: F401  (a fixture: the fake driver and its device)

SOCKET_UNIT = "vllm-xpu-exporter.socket"
PACKAGED_LISTEN_STREAM = "ListenStream=10447\n"


def refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == errno.ECONNREFUSED


def test_the_packaged_socket_starts_the_packaged_exporter_at_the_first_scrape_and_it_serves_that_socket(
        shared: Path, fake_driver: Path):
    exporter = packaged_exporter(shared, shared / fake_driver.name)
    own_port = free_port()  # the service's --web.listen-address: not used under socket activation
    files = dict(exporter.files)
    defaults = "/etc/default/vllm-xpu-exporter"
    files[defaults] = files[defaults].replace(f"--web.listen-address=127.0.0.1:{exporter.port}",
                                              f"--web.listen-address=127.0.0.1:{own_port}")
    socket_unit = (REPO / "packaging" / SOCKET_UNIT).read_text()
    assert PACKAGED_LISTEN_STREAM in socket_unit
    # the namespace shares the host's network: loopback and a free port, not :10447
    files[f"/etc/systemd/system/{SOCKET_UNIT}"] = socket_unit.replace(
        PACKAGED_LISTEN_STREAM, f"ListenStream=127.0.0.1:{exporter.port}\n")
    files[f"/etc/systemd/system/{EXPORTER_UNIT}.d/socket.conf"] = (
        REPO / "packaging" / "vllm-xpu-exporter-socket.conf").read_text()
    with RealSystemd(shared, files=files) as machine:
        machine.start(SOCKET_UNIT)
        before = machine.systemctl("is-active", EXPORTER_UNIT, check=False).stdout.strip()
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_exporter_collector_success", collector="levelzero") == 1 and s,
                           timeout=30, interval=0.5)
        after = machine.systemctl("is-active", EXPORTER_UNIT, check=False).stdout.strip()
        machine.sync_journal()
        lines = "\n".join(str(journal_field(entry, "MESSAGE")) for entry in machine.journal(EXPORTER_UNIT))
        own_port_refused = refused(own_port)
    assert before == "inactive"
    assert samples and sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 1, lines
    assert after == "active", lines
    assert f"listening on http://127.0.0.1:{exporter.port}/metrics" in lines
    assert own_port_refused
