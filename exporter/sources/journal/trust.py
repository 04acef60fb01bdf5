"""Who wrote a container's record, from the fields journald itself adds.

journald stamps every record with fields taken from the sender's kernel credentials and /proc entries
(`_UID`, `_COMM`, `_EXE`, `_SYSTEMD_UNIT`, ...); every other field (`CONTAINER_NAME`, `PODMAN_EVENT`,
`SYSLOG_IDENTIFIER`, ...) is whatever the sender wrote, and anyone who reaches the system journal (system
users, `nobody`, DynamicUser services; everyone on a volatile journal) can write them. So a record naming a
container is believed only when the trusted fields show that a container runtime wrote it: each runtime with a
journald log driver says whom it believes (`vllm_xpu_exporter.runtimes.JournalDriver.writer`, and its exit
event's `writer`; Docker: the system's dockerd; Podman: a conmon or podman in a system directory, as root or as
a rootless user, whose uid is part of the key). `DRIVERS` are those runtimes' drivers, in the registry's order;
the first whose writer it is, wins. Everything else is rejected and counted by reason
(`REJECTED_CONTAINER_SENDER`, an exit event's `rejected`; `xpu_exporter_journal_entries_rejected_total`).
"""

from __future__ import annotations

from vllm_xpu_exporter.runtimes import JournalDriver, JournalExitEvent
from vllm_xpu_exporter.runtimes.registry import RUNTIMES

DRIVERS: tuple[JournalDriver, ...] = tuple(runtime.facts.JOURNAL for runtime in RUNTIMES
                                          if runtime.facts.JOURNAL is not None)
EXIT_EVENTS: tuple[tuple[JournalExitEvent, JournalDriver], ...] = tuple(
    (driver.exit_event, driver) for driver in DRIVERS if driver.exit_event is not None)

REJECTED_CONTAINER_SENDER = "container_sender"
"""A record naming a watched container not written by that container's runtime (dockerd, conmon)."""
REJECTION_REASONS = (REJECTED_CONTAINER_SENDER, *(event.rejected for event, _ in EXIT_EVENTS))
