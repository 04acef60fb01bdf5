"""What xpu_exporter_build_info says besides the version: the source revision the running code was built from,
and the Python that runs it.

The revision is looked for where each way of installing leaves it, first found wins:
1. a git checkout the package is run from (`pip install -e`, or `python -m` in a clone): the commit its HEAD
   names, read from the repository's files (worktrees, packed refs), no `git` run;
2. the file REVISION beside this module, which a build writes (the container image from its REVISION build
   argument; a release wheel from `git rev-parse HEAD` before `python -m build`);
3. the installed distribution's `direct_url.json` (PEP 610), where pip records the commit of a
   `pip install git+https://...@REF`;
otherwise "unknown".
"""

from __future__ import annotations

import functools
import json
import platform
import re
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "vllm-xpu-exporter"
UNKNOWN = "unknown"
REVISION_FILE = Path(__file__).with_name("REVISION")
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_MAX_GIT_FILE_BYTES = 1 << 20  # packed-refs of a large repository; HEAD and a ref are one line


@functools.cache
def revision() -> str:
    """The source revision (a full commit id), or "unknown"; looked up once."""
    return (checkout_revision(Path(__file__).resolve().parent) or file_revision(REVISION_FILE)
            or installed_revision() or UNKNOWN)


def python_version() -> str:
    return platform.python_version()


def checkout_revision(directory: Path) -> str | None:
    """The commit HEAD names in the git work tree that holds `directory`, if any."""
    for folder in (directory, *directory.parents):
        dot_git = folder / ".git"
        if dot_git.exists():
            return _head_commit(_git_directory(dot_git))
    return None


def file_revision(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return text if _COMMIT.fullmatch(text) else None


def installed_revision(distribution: metadata.Distribution | None = None) -> str | None:
    """The commit pip recorded for a VCS install of the distribution (default: the installed
    vllm-xpu-exporter), from its direct_url.json's vcs_info."""
    try:
        direct_url = (distribution or metadata.distribution(DISTRIBUTION)).read_text("direct_url.json")
        commit = json.loads(direct_url or "{}").get("vcs_info", {}).get("commit_id", "")
    except (metadata.PackageNotFoundError, ValueError, AttributeError, OSError):
        return None
    return commit if isinstance(commit, str) and _COMMIT.fullmatch(commit) else None


def _git_directory(dot_git: Path) -> Path:
    """.git itself, or where a worktree's or submodule's `.git` file points (`gitdir: PATH`)."""
    if dot_git.is_dir():
        return dot_git
    text = _read(dot_git) or ""
    target = text.removeprefix("gitdir:").strip() if text.startswith("gitdir:") else ""
    return (dot_git.parent / target).resolve() if target else dot_git


def _head_commit(git_dir: Path) -> str | None:
    head = (_read(git_dir / "HEAD") or "").strip()
    if _COMMIT.fullmatch(head):
        return head  # a detached HEAD
    if not head.startswith("ref: "):
        return None
    ref = head.removeprefix("ref: ").strip()
    # a worktree keeps its HEAD, the refs are the common directory's
    common = (_read(git_dir / "commondir") or "").strip()
    for directory in (git_dir, (git_dir / common).resolve() if common else None):
        if directory is None:
            continue
        loose = (_read(directory / ref) or "").strip()
        if _COMMIT.fullmatch(loose):
            return loose
        for line in (_read(directory / "packed-refs") or "").splitlines():
            commit, _, name = line.partition(" ")
            if name == ref and _COMMIT.fullmatch(commit):
                return commit
    return None


def _read(path: Path) -> str | None:
    try:
        with open(path, "rb") as file:
            return file.read(_MAX_GIT_FILE_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None

