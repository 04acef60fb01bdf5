"""xpu_exporter_build_info's revision (vllm_xpu_exporter.buildinfo): from this checkout's own git files, from
git directories laid out as git lays them (loose and packed refs, a worktree's `.git` file, a detached HEAD),
from the REVISION file a build writes and from pip's direct_url.json; and on a scrape of the exporter."""

from __future__ import annotations

import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from exporterproc import RunningExporter
from vllm_xpu_exporter import __version__, buildinfo

REPO = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "89abcdef0123456789abcdef0123456789abcdef"


def git_head(directory: Path) -> str:
    return subprocess.run(["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_checkout_revision_is_the_commit_git_names_for_head():
    assert buildinfo.checkout_revision(REPO / "exporter") == git_head(REPO)


def git_directory(root: Path, head: str, loose: dict[str, str] | None = None, packed: str = "") -> Path:
    git_dir = root / ".git"
    git_dir.mkdir(parents=True)
    (git_dir / "HEAD").write_text(head)
    for ref, commit in (loose or {}).items():
        (git_dir / ref).parent.mkdir(parents=True, exist_ok=True)
        (git_dir / ref).write_text(commit + "\n")
    if packed:
        (git_dir / "packed-refs").write_text(packed)
    return git_dir


@pytest.mark.fast
@pytest.mark.parametrize("head, loose, packed, expected", [
    ("ref: refs/heads/main\n", {"refs/heads/main": COMMIT}, "", COMMIT),
    ("ref: refs/heads/main\n", {}, f"# pack-refs with: peeled\n{OTHER} refs/heads/other\n{COMMIT} refs/heads/main\n",
     COMMIT),
    (COMMIT + "\n", {}, "", COMMIT),  # detached
    ("ref: refs/heads/unborn\n", {}, "", None),
    ("garbage\n", {}, "", None),
], ids=["loose", "packed", "detached", "unborn", "garbage"])
def test_head_is_followed_through_loose_and_packed_refs(tmp_path, head, loose, packed, expected):
    git_directory(tmp_path, head, loose, packed)
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    assert buildinfo.checkout_revision(tmp_path / "src" / "pkg") == expected


@pytest.mark.fast
def test_a_worktree_has_its_own_head_and_the_main_repositorys_refs(tmp_path):
    main = git_directory(tmp_path / "main", "ref: refs/heads/main\n",
                         {"refs/heads/main": OTHER, "refs/heads/feature": COMMIT})
    worktree_git = main / "worktrees" / "feature"
    worktree_git.mkdir(parents=True)
    (worktree_git / "HEAD").write_text("ref: refs/heads/feature\n")
    (worktree_git / "commondir").write_text("../..\n")
    (tmp_path / "feature").mkdir()
    (tmp_path / "feature" / ".git").write_text(f"gitdir: {worktree_git}\n")
    assert buildinfo.checkout_revision(tmp_path / "feature") == COMMIT


@pytest.mark.fast
def test_the_build_written_file_counts_only_when_it_holds_a_commit(tmp_path):
    written = tmp_path / "REVISION"
    written.write_text(COMMIT + "\n")
    assert buildinfo.file_revision(written) == COMMIT
    written.write_text("unknown\n")  # the Dockerfile's default REVISION build argument
    assert buildinfo.file_revision(written) is None
    assert buildinfo.file_revision(tmp_path / "absent") is None


@pytest.mark.fast
@pytest.mark.parametrize("direct_url, expected", [
    ({"url": "https://example.org/vllm-xpu-exporter.git",
      "vcs_info": {"vcs": "git", "commit_id": COMMIT, "requested_revision": "main"}}, COMMIT),
    ({"url": "file:///src/vllm-xpu-exporter", "dir_info": {"editable": True}}, None),
    (None, None),
], ids=["vcs", "directory", "index"])
def test_a_vcs_install_gives_the_commit_pip_recorded(tmp_path, direct_url, expected):
    dist_info = tmp_path / f"vllm_xpu_exporter-{__version__}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-xpu-exporter\nVersion: {__version__}\n")
    if direct_url is not None:
        (dist_info / "direct_url.json").write_text(json.dumps(direct_url))
    assert buildinfo.installed_revision(metadata.PathDistribution(dist_info)) == expected


def test_a_scrape_says_the_version_revision_and_python(tmp_path):
    with RunningExporter(["--collector.disable-defaults"]) as exporter:
        samples = exporter.scrape()
    [(labels, value)] = [(dict(labels), value) for (name, labels), value in samples.items()
                         if name == "xpu_exporter_build_info"]
    assert labels == {"version": __version__, "revision": git_head(REPO),
                      "pythonversion": platform.python_version()} and value == 1
