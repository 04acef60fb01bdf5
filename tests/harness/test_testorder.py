"""tests/testorder.py: the suite's files and tests in reverse or shuffled order, files kept whole."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from testorder import reordered

pytestmark = pytest.mark.fast


@dataclass(frozen=True)
class Item:
    nodeid: str


ITEMS = [Item(nodeid) for nodeid in ("a.py::one", "a.py::two", "b.py::one", "c.py::one", "c.py::two", "c.py::three")]


def files_in_order(items: list[Item]) -> list[str]:
    files: list[str] = []
    for item in items:
        name = item.nodeid.split("::")[0]
        if not files or files[-1] != name:
            files.append(name)
    return files


def test_file_order_is_the_collected_order() -> None:
    assert reordered(ITEMS, "file", None) == ITEMS


def test_reverse_runs_the_last_file_first_and_each_files_tests_last_to_first() -> None:
    assert [item.nodeid for item in reordered(ITEMS, "reverse", None)] == [
        "c.py::three", "c.py::two", "c.py::one", "b.py::one", "a.py::two", "a.py::one"]


def test_random_is_a_permutation_that_keeps_files_whole_and_repeats_with_its_seed() -> None:
    shuffled = reordered(ITEMS, "random", 7)
    assert sorted(item.nodeid for item in shuffled) == sorted(item.nodeid for item in ITEMS)
    assert sorted(files_in_order(shuffled)) == ["a.py", "b.py", "c.py"]  # each file's tests stay together
    assert reordered(ITEMS, "random", 7) == shuffled
    assert len({tuple(item.nodeid for item in reordered(ITEMS, "random", seed)) for seed in range(20)}) > 1
