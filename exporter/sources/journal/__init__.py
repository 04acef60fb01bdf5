"""The systemd journal as a source, in layers:

- ``binding``: the ctypes binding of libsystemd's sd-journal, and ``JournalError``, the one error raised;
- ``selection``: ``JournalSelection``, which journal (its files, and where containers' ends are) besides the
  ``LogSelection`` both log sources share;
- ``reader``: ``JournalReader`` reads the selected units' and containers' entries as ``LogEntry``; ``open_journal``
  makes one for a ``LogFollower`` (``vllm_xpu_exporter.sources.logs.follower``), which folds them on its thread. The
  reader keeps the handle and the read loop; its concerns are modules of their own beside it: ``decoder`` (an
  entry's fields into a ``LogEntry``, the hot path), ``matches`` (which units and containers are watched, and
  sd-journal's matches for them), ``position`` (the cursor, back-filling, resuming), ``invocations`` (the watched
  units' latest invocations), ``container_ends`` (containers' ends among their entries), ``files`` (the journal's
  files: readable checks, mapped pages), ``host`` (the running boot's id, this process's own unit);
- ``trust``: who wrote a container's record, from the fields journald adds and the runtimes' journald drivers.

The reader's names are re-exported here, so ``from vllm_xpu_exporter.sources.journal import JournalReader``
works from a Python shell.
"""

from vllm_xpu_exporter.sources.journal.binding import JournalError
from vllm_xpu_exporter.sources.journal.host import current_boot_id, own_service_unit, read_own_service_unit
from vllm_xpu_exporter.sources.journal.reader import JournalReader, open_journal
from vllm_xpu_exporter.sources.journal.selection import JournalSelection

__all__ = [
    "JournalError",
    "JournalReader",
    "JournalSelection",
    "current_boot_id",
    "open_journal",
    "own_service_unit",
    "read_own_service_unit",
]
