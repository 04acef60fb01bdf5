"""tests/testorder.py: the suite's files and tests in reverse or shuffled order, files kept whole."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from testorder import pytest_configure, pytest_configure_node, reordered

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


class Config:
    """What testorder's hooks read of a pytest config: the options, and an xdist worker's input."""

    def __init__(self, seed: int | None, **worker: object) -> None:
        self.option = SimpleNamespace(test_order="random", test_order_seed=seed)
        if worker:
            self.workerinput = dict(worker)

    def getoption(self, name: str) -> object:
        return getattr(self.option, name)


def test_every_xdist_worker_takes_the_seed_its_controller_drew() -> None:
    controller = Config(None)
    pytest_configure(controller)
    assert isinstance(controller.option.test_order_seed, int)
    node = SimpleNamespace(config=controller, workerinput={})
    pytest_configure_node(node)
    workers = [Config(None, **node.workerinput) for _ in range(2)]
    for worker in workers:
        pytest_configure(worker)
    assert [worker.option.test_order_seed for worker in workers] == [controller.option.test_order_seed] * 2


def test_a_seed_given_on_the_command_line_is_kept() -> None:
    config = Config(11)
    pytest_configure(config)
    assert config.option.test_order_seed == 11
