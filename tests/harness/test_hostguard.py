"""tests/hostguard.py: a test that changes a systemd configuration tree fails, naming the change."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostguard import unchanged_host_units


def test_an_untouched_tree_passes(tmp_path: Path) -> None:
    (tmp_path / "a.service").write_text("[Service]\n")
    with unchanged_host_units(tmp_path):
        (tmp_path / "a.service").read_text()


@pytest.mark.parametrize("change, named", [
    (lambda root: (root / "vllm-xpu-chat.service.d").mkdir(), "added vllm-xpu-chat.service.d"),
    (lambda root: (root / "a.service").unlink(), "removed a.service"),
    (lambda root: (root / "a.service").write_text("[Service]\nExecStart=/bin/true\n"), "changed a.service"),
])
def test_an_added_removed_or_changed_file_fails_the_test_naming_it(tmp_path: Path, change, named: str) -> None:
    (tmp_path / "a.service").write_text("[Service]\n")
    with pytest.raises(AssertionError, match=named):
        with unchanged_host_units(tmp_path):
            change(tmp_path)



def test_a_change_below_a_subdirectory_is_named_by_its_path_and_linked_directories_are_not_followed(
        tmp_path: Path) -> None:
    units, elsewhere = tmp_path / "units", tmp_path / "elsewhere"
    (units / "multi-user.target.wants").mkdir(parents=True)
    elsewhere.mkdir()
    (units / "linked").symlink_to(elsewhere)
    with pytest.raises(AssertionError, match="added multi-user.target.wants/vllm-xpu-chat.service") as failure:
        with unchanged_host_units(units):
            (units / "multi-user.target.wants" / "vllm-xpu-chat.service").symlink_to("/dev/null")
            (elsewhere / "not-below-the-link.service").write_text("")
    assert "not-below-the-link" not in str(failure.value)
