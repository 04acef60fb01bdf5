"""tests/containerengines.py itself: an engine that cannot start fails the test that asked for it, naming the
engine (never a skip), and the cached image is keyed on what it is built from."""

from __future__ import annotations

from pathlib import Path

import pytest

import containerengines
from containerengines import Dockerd, EngineError, Podman, started


def test_a_dockerd_that_cannot_start_fails_the_test_naming_dockerd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(containerengines, "DOCKERD", str(tmp_path / "no-dockerd"))
    with pytest.raises(pytest.fail.Exception, match=r"^dockerd: .*no-dockerd.*docker\.io"):
        next(started(Dockerd(tmp_path / "docker"), tmp_path / "image.tar"))
    assert not (tmp_path / "docker").exists(), "what it made is removed"


def test_a_dockerd_that_exits_says_why(tmp_path: Path):
    """dockerd refusing its arguments (a data root that is a file) exits at once: the error has its log."""
    engine = Dockerd(tmp_path / "docker")
    engine.data_root.write_text("not a directory")
    with pytest.raises(EngineError, match=r"^dockerd exited \d+: .*"):
        engine.start()
    engine.stop()


def test_a_podman_command_that_fails_names_podman(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(containerengines, "PODMAN", str(tmp_path / "no-podman"))
    with pytest.raises(pytest.fail.Exception, match=r"^podman: no .*no-podman"):
        next(started(Podman(tmp_path / "podman"), tmp_path / "image.tar"))


def test_the_image_is_keyed_on_its_command_line_and_the_apt_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    key = containerengines.image_key()
    monkeypatch.setattr(containerengines, "IMAGE_COMMAND", (*containerengines.IMAGE_COMMAND, "--include=curl"))
    assert containerengines.image_key() != key
    monkeypatch.undo()
    sources = tmp_path / "debian.sources"
    sources.write_text("Types: deb\n")
    monkeypatch.setattr(containerengines, "APT_SOURCES", sources)
    assert containerengines.image_key() != key
