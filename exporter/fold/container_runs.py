"""A container's runs: which start of a container each line it printed belongs to, for the engine-starts
fold (`vllm_xpu_exporter.fold.engine_starts`), which takes one start per invocation id.

systemd gives each start of a unit an invocation id and says when its process ended; a container engine
writes neither into what a container printed. What the sources do know of a container's runs comes with
each of its lines as `container_run`: its id (a container recreated under the same name is a new
container), with Docker's log epoch (`CONTAINER_LOG_EPOCH`, a new one each time the container starts),
Podman's conmon pid (one conmon per start) or the kubelet's restart count (one log file per start of a
pod's container). A container restarted by Docker's restart policy keeps its id and its json-file log,
and an older Docker writes no epoch: such runs are told apart by vLLM itself. A run begins
- where `container_run` changes;
- at a line only a new vLLM process prints, when the run already has one: "vLLM API server version"
  (`vllm.ServerVersion`: the API server prints it once, before anything else of its start) once the run
  printed a server version or an engine config; an engine config ("Initializing a V1 LLM engine (vX)
  with config", `vllm.EngineConfig`) once the run printed one and no server version (an engine without the
  API server, as `vllm.LLM` runs one; a server with several engine cores prints one config per core).
Each run is one invocation id (`<container_run>#<n>`), so the fold opens a start at a run's first vLLM
line, and a run that ended without a cause vLLM printed (killed, or stopped during its init) counts as
failed (`other`) when the next run begins, as a unit's start without a recognised cause does.

Long lines come in pieces (`partial`: Docker's and conmon's journald drivers and json-file logs cut them
at 16 KiB or at conmon's buffer, the kubelet's CRI files mark them `P`): a container's pieces of one
stream are joined with the piece that ends the line, at most `max_line_chars` characters (the rest is
dropped, as the journal reader cuts a long MESSAGE), at the time of the first piece. Pieces left over
when the container's run changes (a run that died in mid-line) are passed on as they are.

Entries of systemd units (a `unit` without `/`) pass through unchanged. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from vllm_xpu_exporter.parsers import vllm

DEFAULT_MAX_LINE_CHARS = 64 * 1024


class ContainerLine(Protocol):
    """What the stage reads of an entry (vllm_xpu_exporter.sources.logs.entry.LogEntry has it; a dataclass, so
    `dataclasses.replace` makes the entry handed on)."""

    unit: str
    realtime_usec: int
    message: str
    container_run: str
    partial: bool
    stream: str


E = TypeVar("E", bound=ContainerLine)


@dataclass
class _Pieces:
    first: ContainerLine
    texts: list[str] = field(default_factory=list)
    chars: int = 0


@dataclass
class _Container:
    run: str = ""  # the sources' run of its latest line
    number: int = 0  # runs begun within it
    printed_version: bool = False  # the current run printed a server version
    printed_config: bool = False  # the current run printed an engine config
    pieces: dict[str, _Pieces] = field(default_factory=dict)  # a line in pieces, by stream


class ContainerRuns:
    """Gives containers' lines the invocation id of their run and joins their pieces; one per fold (a
    journal read again from its start gets a new one)."""

    def __init__(self, max_line_chars: int = DEFAULT_MAX_LINE_CHARS) -> None:
        self.max_line_chars = max_line_chars
        self._containers: dict[str, _Container] = {}

    def lines(self, entries: Iterable[E]) -> Iterator[E]:
        """The entries, containers' with their run's invocation id (`pid` None), pieces joined."""
        for entry in entries:
            if "/" not in entry.unit:
                yield entry
                continue
            container = self._containers.get(entry.unit)
            if container is None:
                container = self._containers[entry.unit] = _Container(entry.container_run)
            if entry.container_run != container.run:
                yield from self._leftovers(container)
                container.run, container.number = entry.container_run, 0
                container.printed_version = container.printed_config = False
            joined = self._join(container, entry)
            if joined is not None:
                yield self._in_run(container, joined)

    def forget(self, unit: str) -> None:
        """A container gone for good (its logs removed): its state goes too."""
        self._containers.pop(unit, None)

    def _join(self, container: _Container, entry: E) -> E | None:
        pieces = container.pieces.get(entry.stream)
        if pieces is None and not entry.partial:
            return entry
        if pieces is None:
            pieces = container.pieces[entry.stream] = _Pieces(entry)
        room = self.max_line_chars - pieces.chars
        if room > 0:
            text = entry.message[:room]
            pieces.texts.append(text)
            pieces.chars += len(text)
        if entry.partial:
            return None
        del container.pieces[entry.stream]
        return replace(pieces.first, message="".join(pieces.texts), partial=False)  # type: ignore[type-var]

    def _leftovers(self, container: _Container) -> Iterator[E]:
        for pieces in container.pieces.values():
            line = replace(pieces.first, message="".join(pieces.texts), partial=False)  # type: ignore[type-var]
            yield self._in_run(container, line)
        container.pieces.clear()

    @staticmethod
    def _in_run(container: _Container, entry: E) -> E:
        message = entry.message
        if "version" in message or "LLM engine (v" in message:  # the cheap pre-check of the two lines below
            event = vllm.parse_line(message)
            if isinstance(event, vllm.ServerVersion):
                if container.printed_version or container.printed_config:
                    container.number += 1
                    container.printed_config = False
                container.printed_version = True
            elif isinstance(event, vllm.EngineConfig):
                if container.printed_config and not container.printed_version:
                    container.number += 1
                container.printed_config = True
        return replace(entry, invocation_id=f"{container.run}#{container.number}", pid=None)  # type: ignore[type-var]
