"""Which inits run at the same time: the overlap windows of the fold's starts, and its possible inits.

An engine start's overlap window opens when its init begins (its main process starts) and closes at its first
KV-cache line, its init-complete line or its end; a start whose window opens while another unit's is open
overlaps it, and both count one overlap, once. A *possible init* (a start of a unit not known yet to run vLLM,
`vllm_xpu_exporter.fold.engine_starts`) overlaps nothing while it is possible; if it turns out to be an engine
start, its window is taken to have opened when its main process began, and it overlaps, retroactively, every
window that was open since.

Opening a window costs the starts it newly overlaps, not a look at every unit: the windows not overlapped yet
are kept apart, and of the windows that closed not overlapped, only those a pending possible init may still
overlap.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Protocol

from vllm_xpu_exporter.fold.start import Start


class Owner(Protocol):
    """The unit a start belongs to, as far as overlaps go: its overlap counter."""

    overlaps: int


@dataclass(frozen=True)
class PossibleInit:
    """What judging a possible init's overlaps from its main process's start needs, should it turn out
    to be an engine start."""

    owner: Owner
    began_entry: int  # the number of the entry at which its main process began (InitWindows._entry_number)
    windows_opened_before: int  # overlap windows opened before it began
    met_an_init: bool  # another unit's overlap window was open when it began


class InitWindows:
    """The open overlap windows and the pending possible inits of one fold (one owner's units)."""

    def __init__(self) -> None:
        # Starts in their overlap window, and those of them not overlapped yet.
        self._open_windows: dict[Start, Owner] = {}
        self._awaiting_overlap: dict[Start, Owner] = {}
        # Possible inits, in the order their main processes began; and the overlap windows that closed not
        # overlapped while one was pending, with the number of the entry that closed them: a possible init
        # found to be an engine start overlaps those that closed after it began.
        self._possible: dict[Start, PossibleInit] = {}
        self._unpaired_closed: dict[Start, tuple[Owner, int]] = {}
        # The number of the entry being folded: orders possible inits against overlap windows. Not the count
        # of entries read (xpu_exporter_journal_entries_read_total): the journal follower keeps that.
        self._entry_number = 0
        self._windows_opened = 0

    def next_entry(self) -> None:
        """The fold takes its next entry (what follows happens at it)."""
        self._entry_number += 1

    def open(self, owner: Owner, start: Start, possible: PossibleInit | None = None) -> None:
        """The start's overlap window opens: it overlaps the inits running now and, when it was a possible
        init until now, every init whose window was open since its main process began."""
        start.initialising = True
        closed_since: list[tuple[Start, Owner]] = []
        overlapping = bool(self._open_windows)  # other units' inits: this unit's earlier start has ended
        if possible is not None:
            closed_since = [(other_start, other) for other_start, (other, closed_entry)
                            in self._unpaired_closed.items() if closed_entry > possible.began_entry]
            overlapping = overlapping or possible.met_an_init or self._windows_opened > possible.windows_opened_before
        if overlapping:
            _overlapped(owner, start)
            for other_start, other in chain(self._awaiting_overlap.items(), closed_since):
                _overlapped(other, other_start)
            self._awaiting_overlap.clear()
            for other_start, _ in closed_since:
                del self._unpaired_closed[other_start]
        else:
            self._awaiting_overlap[start] = owner
        self._open_windows[start] = owner
        self._windows_opened += 1

    def close(self, start: Start) -> None:
        """The start's overlap window closes (a KV-cache line, its init done, its end)."""
        start.initialising = False
        self._open_windows.pop(start, None)
        owner = self._awaiting_overlap.pop(start, None)
        if owner is not None and self._possible:
            self._unpaired_closed[start] = (owner, self._entry_number)

    def begin_possible(self, owner: Owner, start: Start) -> None:
        """The main process of a start not known to run vLLM began: a possible init."""
        self._possible[start] = PossibleInit(owner, self._entry_number, self._windows_opened,
                                             bool(self._open_windows))

    def engine_found(self, owner: Owner, start: Start) -> bool:
        """The start printed its first vLLM line: if it was a possible init, its window opens as of its main
        process's start (True); False when it was none."""
        possible = self._possible.pop(start, None)
        if possible is None:
            return False
        self.open(owner, start, possible)
        self._forget_unpaired_windows()
        return True

    def end_possible(self, start: Start) -> None:
        """The start is no possible init any more (not an engine, or ended)."""
        if self._possible.pop(start, None) is not None:
            self._forget_unpaired_windows()

    def end_possible_past_grace(self, now_usec: int, grace_usec: int) -> list[tuple[Owner, Start]]:
        """End the possible inits whose main process began more than `grace_usec` before `now_usec`; they
        are returned, oldest first."""
        ended = []
        while self._possible:
            start, possible = next(iter(self._possible.items()))
            if now_usec - start.main_began_usec <= grace_usec:
                break
            self.end_possible(start)
            ended.append((possible.owner, start))
        return ended

    def forget(self, gone: Owner) -> None:
        """A unit gone for good: its inits overlap nothing from now on."""
        for starts in (self._open_windows, self._awaiting_overlap):
            for start in [start for start, owner in starts.items() if owner is gone]:
                del starts[start]
        for start in [start for start, possible in self._possible.items() if possible.owner is gone]:
            del self._possible[start]
        for start in [start for start, (owner, _) in self._unpaired_closed.items() if owner is gone]:
            del self._unpaired_closed[start]

    def _forget_unpaired_windows(self) -> None:
        """Drop the closed windows that no pending possible init began before."""
        if not self._possible:
            self._unpaired_closed.clear()
            return
        earliest = next(iter(self._possible.values())).began_entry
        while self._unpaired_closed:
            oldest = next(iter(self._unpaired_closed))
            if self._unpaired_closed[oldest][1] > earliest:
                return
            del self._unpaired_closed[oldest]


def _overlapped(owner: Owner, start: Start) -> None:
    if not start.overlapped:
        start.overlapped = True
        owner.overlaps += 1
