"""Which journal to read, beside what the log sources share: ``JournalSelection``.

``LogSelection`` (``vllm_xpu_exporter.sources.logs.entry``) says which units and containers are watched and
from which boot; what only the journal reader uses is here: which journal files, and where the container
runtimes' state says when a container that logs to the journal ended.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vllm_xpu_exporter.runtimes.registry import RUNTIMES
from vllm_xpu_exporter.sources.logs.entry import LogSelection


@dataclass(frozen=True, slots=True)
class JournalSelection(LogSelection):
    """A ``LogSelection`` of the journal:

    - ``directory``: read the journal files in this directory (and its machine-id subdirectories),
      e.g. a host's ``/var/log/journal`` mounted into a container.
    - ``files``: read exactly these journal files (exclusive with ``directory``).
    - neither: the local system journal (``SD_JOURNAL_LOCAL_ONLY | SD_JOURNAL_SYSTEM``).
    - ``container_state``: where the container runtimes' state is (``ContainerNames``' keywords, e.g.
      ``{"docker_roots": ("/var/lib/docker",)}``, ``--path.docker``), for the ends of watched containers that the
      journal does not record (a runtime's ``exit_watch``: Docker's ``config.v2.json``); none: not read.
    """

    directory: str | None = None
    files: Sequence[str] = ()
    container_state: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        LogSelection.__post_init__(self)
        object.__setattr__(self, "files", tuple(self.files))
        object.__setattr__(self, "container_state", dict(self.container_state))
        if self.directory is not None and self.files:
            raise ValueError("a journal directory and journal files cannot both be given")

    def may_match_container_name(self, name: str) -> bool:
        """Whether a ``CONTAINER_NAME`` in the journal may be a watched container's, of any runtime that logs
        to the journal (a glob with ``/`` against the key the name would have)."""
        return any(fnmatch.fnmatchcase(name, glob) if "/" not in glob else
                   any(fnmatch.fnmatchcase(f"{kind}/{name}", glob) for kind in _JOURNAL_KINDS)
                   for glob in self.container_globs)


_JOURNAL_KINDS = tuple(runtime.kind for runtime in RUNTIMES if runtime.facts.JOURNAL is not None)
