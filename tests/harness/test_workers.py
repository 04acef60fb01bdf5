"""tests/workers.py: on several workers, the tests that use the whole host stay on one, the others spread."""

from __future__ import annotations

import pytest

from workers import HOST_GROUP, group_host_wide, host_wide

pytestmark = pytest.mark.fast


def test_a_real_systemd_test_is_host_wide_whatever_its_fixtures():
    assert host_wide("tests/real_systemd/test_gate_real_systemd.py::test_x", ["tmp_path"])


@pytest.mark.parametrize("fixture", ["task_limit", "engine_image", "dockerd", "podman"])
def test_a_test_taking_a_fixture_of_the_whole_host_is_host_wide(fixture: str):
    assert host_wide("tests/collectors/test_faults.py::test_x", ["tmp_path", fixture])


def test_other_tests_are_not_host_wide_even_when_a_name_contains_the_folders():
    assert not host_wide("tests/gate/test_gate.py::test_real_systemd_like[x]", ["tmp_path", "fake_driver"])
    assert not host_wide("tests/harness/test_not_real_systemd/x.py::test_x", [])


class Config:
    def __init__(self, xdist: bool) -> None:
        self.pluginmanager = self
        self.xdist = xdist

    def has_plugin(self, name: str) -> bool:
        return self.xdist and name == "xdist"


class Item:
    def __init__(self, nodeid: str, *fixturenames: str) -> None:
        self.nodeid = nodeid
        self.fixturenames = list(fixturenames)
        self.markers: list[pytest.Mark] = []

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker.mark)


def test_with_xdist_the_host_wide_items_and_only_they_are_in_the_host_group():
    items = [Item("tests/real_systemd/test_a.py::t"), Item("tests/sources/test_b.py::t", "dockerd"),
             Item("tests/parsers/test_c.py::t", "fake_driver")]
    group_host_wide(Config(xdist=True), items)
    assert [[(mark.name, mark.args) for mark in item.markers] for item in items] == [
        [("xdist_group", (HOST_GROUP,))], [("xdist_group", (HOST_GROUP,))], []]


def test_without_xdist_no_item_is_marked():
    items = [Item("tests/real_systemd/test_a.py::t")]
    group_host_wide(Config(xdist=False), items)
    assert items[0].markers == []
