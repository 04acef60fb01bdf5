"""The systemd journal as a source, in three layers:

- ``binding``: the ctypes binding of libsystemd's sd-journal, and ``JournalError``, the one error raised;
- ``reader``: ``JournalReader`` reads the selected units' entries (``JournalSelection``) as ``JournalEntry``;
- ``follower``: ``JournalFollower``, a thread that catches up, then follows, folding the entries into
  engine starts (``vllm_xpu_exporter.fold.engine_starts``) and publishing them as ``JournalState``.

The reader's names are re-exported here, so ``from vllm_xpu_exporter.sources.journal import JournalReader``
works from a Python shell; the follower is imported from its module (it pulls in the fold).
"""

from vllm_xpu_exporter.sources.journal.binding import JournalError
from vllm_xpu_exporter.sources.journal.reader import (
    DEFAULT_CONTAINER_GLOBS,
    DEFAULT_UNIT_GLOBS,
    JournalEntry,
    JournalReader,
    JournalSelection,
    current_boot_id,
    normalize_boot,
    own_service_unit,
    read_own_service_unit,
)

__all__ = [
    "DEFAULT_CONTAINER_GLOBS",
    "DEFAULT_UNIT_GLOBS",
    "JournalEntry",
    "JournalError",
    "JournalReader",
    "JournalSelection",
    "current_boot_id",
    "normalize_boot",
    "own_service_unit",
    "read_own_service_unit",
]
