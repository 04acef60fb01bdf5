"""The ends of watched containers that log to the journal, handed on among their entries as systemd's records
of a unit's end are among its lines (``JournalReader``, with container globs).

A Docker container's end is not in the journal: with the selection's ``docker_roots`` (``--path.docker``) it is
read from the container's ``config.v2.json`` (``CONTAINER_ID_FULL``), as the json-file source does, and handed on
as ``container_end``. A Podman container's end is in the journal when its events logger is ``journald``: its
"died" event, which the decoder returns with the run ``DIED_RUN`` + its container's id.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, replace

from vllm_xpu_exporter.parsers.containerlogs import DockerExit
from vllm_xpu_exporter.sources.containers import DockerEnd
from vllm_xpu_exporter.sources.journal.decoder import DIED_RUN
from vllm_xpu_exporter.sources.logs.entry import LogEntry, container_end

DOCKER_END_SECONDS = 1.0
"""How often, at most, the reader looks at its Docker containers' ``config.v2.json`` for their end."""

_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


@dataclass
class _DockerRun:
    """A Docker container of the journal (``docker/<name>``): its latest run and where its end is read."""

    run: str
    container_id: str
    since_usec: int  # the run's first entry: an end before it is an older run's
    end: DockerEnd


class ContainerEnds:
    """The watched containers' ends among the entries of one read position (a new one when the reader starts
    reading again from the start of the boot)."""

    def __init__(self, docker_containers: tuple[str, ...]) -> None:
        self._docker_containers = docker_containers
        """The Docker roots' ``containers`` directories; none: Docker containers' ends are not read."""
        self._docker_runs: dict[str, _DockerRun] = {}
        """Watched Docker containers returned so far (by key), whose end is looked for."""
        self._docker_end_due = 0.0
        self._pending: list[tuple[int, str, DockerExit]] = []
        """Ends read, not handed on yet (their time, key, end), earliest first."""
        self._podman_runs: dict[str, str] = {}
        """The latest run of each watched Podman container returned (its "died" event ends it)."""

    @property
    def next_look(self) -> float | None:
        """When (``time.monotonic()``) the Docker containers' ends are to be looked at again; None while none is
        followed. The reader wakes up for it while it waits on a quiet journal."""
        return self._docker_end_due if self._docker_runs else None

    def among(self, entries: list[LogEntry], *, at_end: bool) -> list[LogEntry]:
        """The entries with the ends of watched containers among them: a Docker container's end is read from
        its ``config.v2.json`` (``vllm_xpu_exporter.sources.containers.DockerEnd``: once its ``State.Running``
        is false) when a new run of it is met, and, once the reader is at the journal's end (``at_end``), at
        most every ``DOCKER_END_SECONDS`` (a stat of one file a container, read when it changed); never per
        entry. An end goes before the first entry later than it (reading a boot's history, the container's
        death comes before the inits that followed it, which then overlap nothing) or, none being later, at
        the end, in the container's latest run then. So a container that died silently during its init
        counts as `other` (unless its cause comes within the grace), one ``docker stop`` ended as stopped,
        and neither stays initialising, as with its json-file log (``vllm_xpu_exporter.sources.containerlogs``).
        A Podman container's "died" event (``PODMAN_EVENT=died``, selected with its name) is such an end
        where the journal has it: it goes in the container's latest run when that run is of the event's
        container (``PODMAN_ID``), else it is dropped (a container none of whose lines was read)."""
        pending = self._pending
        podman_runs = self._podman_runs
        docker = bool(self._docker_containers)
        out: list[LogEntry] = []
        for entry in entries:
            if pending and pending[0][0] < entry.realtime_usec:
                self._hand_on(out, entry.realtime_usec)
            run = entry.container_run
            if not run:
                out.append(entry)
                continue
            if entry.from_systemd:  # a Podman container's "died" event: in its latest run, if it is that one's
                latest = podman_runs.get(entry.unit)
                if latest is not None and latest.split("/", 1)[0] == run[len(DIED_RUN):]:
                    out.append(replace(entry, container_run=latest))
                continue
            if entry.unit.startswith("podman/"):
                podman_runs[entry.unit] = run
            elif docker and entry.unit.startswith("docker/"):
                known = self._docker_runs.get(entry.unit)
                if known is None or known.run != run:
                    self._docker_run_met(entry.unit, run, entry.realtime_usec, known)
            out.append(entry)
        if at_end:
            if self._docker_runs and time.monotonic() >= self._docker_end_due:
                self._docker_end_due = time.monotonic() + DOCKER_END_SECONDS
                for key, known in self._docker_runs.items():
                    self._look_for_docker_end(key, known)
            self._hand_on(out, None)
        return out

    def _docker_run_met(self, key: str, run: str, realtime_usec: int, known: _DockerRun | None) -> None:
        """A new run of a Docker container (``CONTAINER_ID_FULL``, with its log epoch): its end is looked for."""
        container_id = run.split("/", 1)[0]
        if known is not None and known.container_id == container_id:
            end = known.end  # a new start of the same container: its end is the same file's
        elif _CONTAINER_ID.fullmatch(container_id):
            end = DockerEnd(tuple(os.path.join(directory, container_id, "config.v2.json")
                                  for directory in self._docker_containers))
        else:
            end = DockerEnd(())  # no CONTAINER_ID_FULL (only a short id): its end cannot be read
        known = self._docker_runs[key] = _DockerRun(run, container_id, realtime_usec, end)
        self._look_for_docker_end(key, known)

    def _look_for_docker_end(self, key: str, known: _DockerRun) -> None:
        ended = known.end.ended(known.since_usec)
        if ended is not None:
            self._pending.append((ended.realtime_usec, key, ended))
            self._pending.sort(key=lambda pending: pending[0])

    def _hand_on(self, out: list[LogEntry], before_usec: int | None) -> None:
        """The pending ends earlier than ``before_usec`` (all: None), each in its container's latest run."""
        pending = self._pending
        while pending and (before_usec is None or pending[0][0] < before_usec):
            _, key, ended = pending.pop(0)
            out.append(container_end(key, ended, self._docker_runs[key].run))
