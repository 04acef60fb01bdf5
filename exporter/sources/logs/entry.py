"""The entries both log sources return, and the selection both read by.

A ``LogEntry`` is one line a watched unit or container printed, or systemd's record about a unit (a container's
end is handed on as such a record: ``container_end``). The journal reader (``vllm_xpu_exporter.sources.journal``)
and the container log reader (``vllm_xpu_exporter.sources.containerlogs``) return them in batches of at most
``DEFAULT_BATCH``; ``LogFollower`` (``vllm_xpu_exporter.sources.logs.follower``) folds them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from vllm_xpu_exporter.parsers.workloads import name_of_key
from vllm_xpu_exporter.systemd import MESSAGE_ID_UNIT_PROCESS_EXIT, MESSAGE_ID_UNIT_STOPPING

DEFAULT_UNIT_GLOBS = ("vllm*.service",)
DEFAULT_CONTAINER_GLOBS = ("*vllm*",)
"""The exporter's default container globs (``--journal.containers``); a ``LogSelection`` has none unless given."""
DEFAULT_BATCH = 4096
"""Entries a reader's ``read_available()`` returns at most, by default; the follower reads in batches of it."""

_HEX32 = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One entry of a watched unit or container: what it printed, or PID 1's record about a unit.

    No cursor: formatting one costs as much as reading the entry, and the consumer re-reads
    the selected boot on start instead of resuming.
    """

    unit: str
    """The watched unit the entry belongs to (``_SYSTEMD_UNIT``, or ``UNIT`` of a PID-1 record), or the
    watched container's key (``vllm_xpu_exporter.parsers.workloads``)."""
    realtime_usec: int
    monotonic_usec: int | None
    boot_id: str
    """32 lower-case hex digits."""
    message: str
    """MESSAGE as UTF-8 (undecodable bytes replaced), at most the reader's max_message_bytes; '' if absent."""
    from_systemd: bool
    """True for PID 1's records about the unit (``_PID=1``, ``UNIT=<unit>``)."""
    message_id: str
    """MESSAGE_ID, or '' if absent."""
    pid: int | None
    invocation_id: str = ""
    """The start's invocation id: ``_SYSTEMD_INVOCATION_ID`` of the unit's output, ``INVOCATION_ID`` of
    PID 1's records (32 hex digits); '' if absent, and for a container's line until
    ``vllm_xpu_exporter.fold.container_runs.ContainerRuns`` gives it its run's."""
    container_run: str = ""
    """A container's line (``unit`` is its key, with a ``/``): what the source knows of the container's
    run, as its runtime tells it (``vllm_xpu_exporter.runtimes``): its id, with what tells its starts apart;
    '' for a unit's entry. ``pid`` is then None: the entry's ``_PID`` is the runtime's, not the container's."""
    partial: bool = False
    """The line goes on in the container's next line (``CONTAINER_PARTIAL_MESSAGE=true``: the log driver
    cut a long line)."""
    stream: str = ""
    """Which output of the container the line is from, where the source says (``stdout``, ``stderr``)."""


def container_end(key: str, realtime_usec: int, stopped: bool, run: str) -> LogEntry:
    """A container's end, as its runtime's state says it, as systemd records a unit's: its main process exited
    (``other`` unless a cause comes within the grace), or it was stopped (nothing counts), in
    the container's run ``run``. Both sources of a container's lines hand it on so: its log files and the
    journal."""
    message_id = MESSAGE_ID_UNIT_STOPPING if stopped else MESSAGE_ID_UNIT_PROCESS_EXIT
    return LogEntry(key, realtime_usec, None, "", "", True, message_id, None, "", run)


@dataclass(frozen=True, slots=True)
class LogSelection:
    """Which units and containers are watched, and from which boot: what both log sources read by (where a log
    is, is each reader's own: the journal's ``JournalSelection``, the container log reader's directories).

    - ``unit_globs``: shell globs of the watched units' names.
    - ``container_globs``: shell globs of the watched containers (``matches_container``); none by default.
    - ``excluded_units``: units never watched, whatever the globs say: the exporter's own unit
      (``vllm_xpu_exporter.sources.journal.host.own_service_unit``), which the default glob ``vllm*.service``
      matches.
    - ``boot``: ``"current"`` (this kernel's boot id), ``"all"``, or a boot id (32 hex digits or
      the dashed UUID form; normalised to 32 lower-case hex digits).
    - ``engine_grace_usec``: how long a start of a watched unit not known to run vLLM is taken as a
      possible engine init (``vllm_xpu_exporter.fold.engine_starts``; ``--journal.engine-grace``); None: the
      fold's default. The readers do not use it; the follower folds the selected entries with it.
    """

    unit_globs: Sequence[str] = DEFAULT_UNIT_GLOBS
    boot: str = "current"
    container_globs: Sequence[str] = ()
    excluded_units: Sequence[str] = ()
    engine_grace_usec: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "unit_globs", tuple(self.unit_globs))
        object.__setattr__(self, "container_globs", tuple(self.container_globs))
        if any(not glob for glob in self.container_globs):
            raise ValueError("a container glob is empty")
        object.__setattr__(self, "excluded_units", frozenset(self.excluded_units))
        if not self.unit_globs or any(not glob for glob in self.unit_globs):
            raise ValueError("at least one non-empty unit glob is needed")
        object.__setattr__(self, "boot", normalize_boot(self.boot))

    def matches_unit(self, unit: str) -> bool:
        """Whether a unit is watched; for a container's key (``<kind>/<name>``: a unit name never has a ``/``),
        ``matches_container``."""
        if "/" in unit:
            return self.matches_container(unit, name_of_key(unit))
        return unit not in self.excluded_units and any(fnmatch.fnmatchcase(unit, glob) for glob in self.unit_globs)

    def matches_container(self, key: str, name: str) -> bool:
        """Whether a container is watched: a glob without ``/`` is matched against its name (a pod's container:
        the container's), one with ``/`` against its key (``k8s/inference/*/vllm``)."""
        return any(fnmatch.fnmatchcase(key if "/" in glob else name, glob) for glob in self.container_globs)


def normalize_boot(boot: str) -> str:
    """``"current"``, ``"all"`` or a boot id as 32 lower-case hex digits; ValueError otherwise."""
    text = boot.strip().lower()
    if text in ("current", "all"):
        return text
    compact = text.replace("-", "") if _is_dashed_uuid(text) else text
    if not _HEX32.fullmatch(compact):
        raise ValueError(f"invalid boot {boot!r}: want 'current', 'all' or a 32-hex-digit boot id")
    return compact


def _is_dashed_uuid(text: str) -> bool:
    return [len(part) for part in text.split("-")] == [8, 4, 4, 4, 12]
