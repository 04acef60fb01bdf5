"""What vLLM containers print, as the container engines store it: in the journal (Docker's and Podman's
``journald`` log driver, through journalgen), in Docker's ``json-file`` logs and in the kubelet's CRI log
files, rotation and long lines included.

The lines are vllmlogs' (the same runs, the same physical lines at the same times as the systemd units of
the seed's boot race); a container's runs are what systemd's starts of a unit were: a failed run is
restarted by the engine's restart policy (the same container: Docker keeps its id and its json-file log, the
kubelet writes the next restart's file).

Usable from a shell::

    >>> race = vllmlogs.boot_race()
    >>> lines = container_lines(race.this_boot(), RACE_CONTAINERS)
    >>> journalgen.write_journal("/tmp/c.journal", journald_specs(lines, race.boot_id, booted_at))
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import journalgen
from journalgen import JournalEntrySpec, Moment
from vllmlogs import CHAT, EMBEDDING, STT, UNWATCHED, Placed

# The seed's units as containers: what `docker run --name ...` would call them.
RACE_CONTAINERS = {CHAT: "vllm-xpu-chat", EMBEDDING: "vllm-xpu-embedding", STT: "vllm-xpu-stt",
                   UNWATCHED: "other-llm"}


@dataclass(frozen=True)
class ContainerLine:
    """One physical line a container printed (one journal entry, one json-file or CRI record)."""

    realtime_usec: int
    monotonic_usec: int
    name: str  # the container's name (Docker, Podman) or the pod's container's name
    message: str
    run: int  # the container's run: 0 its first start, 1 the restart after it, ...
    role: str = ""  # vllmlogs' role of the line (root cause, init done, ...)
    stream: str = "stdout"


def container_lines(placed: Iterable[Placed], names: Mapping[str, str]) -> list[ContainerLine]:
    """The lines the units of `names` printed (not PID 1's records), as their containers': each start of a
    unit (an invocation) is a run of its container, numbered in order."""
    runs: dict[str, dict[str, int]] = {}
    lines = []
    for entry in placed:
        planned = entry.planned
        if planned.from_systemd or planned.unit not in names:
            continue
        unit_runs = runs.setdefault(planned.unit, {})
        run = unit_runs.setdefault(planned.invocation_id, len(unit_runs))
        lines.append(ContainerLine(entry.realtime_usec, entry.monotonic_usec, names[planned.unit], planned.message,
                                   run, planned.role))
    return lines


def epoch(name: str, run: int) -> str:
    """Docker's CONTAINER_LOG_EPOCH of a run: 64 random hex digits per start of the container."""
    return uuid.uuid5(uuid.NAMESPACE_OID, f"{name}#{run}").hex * 2


def journald_specs(lines: Iterable[ContainerLine], boot_id: str, *, runtime: str = "docker",
                   epochs: bool = True, conmon_pid: int = 2900) -> list[JournalEntrySpec]:
    """The lines as the journald log driver stores them: Docker's (one epoch per run; `epochs=False`: none,
    as Docker before 23) or Podman's (one conmon per run)."""
    return [
        journalgen.container_output(
            line.name, line.message, Moment(line.realtime_usec, line.monotonic_usec, boot_id), runtime=runtime,
            epoch=epoch(line.name, line.run) if epochs else None, conmon_pid=conmon_pid + 100 * line.run,
            stderr=line.stream == "stderr")
        for line in lines
    ]


def by_name(lines: Sequence[ContainerLine]) -> dict[str, list[ContainerLine]]:
    out: dict[str, list[ContainerLine]] = {}
    for line in lines:
        out.setdefault(line.name, []).append(line)
    return out
