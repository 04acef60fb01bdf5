"""The suite in another order, to show that no test depends on what an earlier one left behind:
`--test-order=reverse` runs the test files last to first and each file's tests last to first;
`--test-order=random` shuffles the files, and the tests within each file, with a seed that the run's header
and its summary print (`--test-order-seed=N` repeats a run). Files stay whole, so a module's fixtures are
set up once as in the default order (`--test-order=file`). conftest.py adds the options (add_options),
takes the hooks and calls reorder from its collection hook."""

from __future__ import annotations

import random

import pytest

ORDERS = ("file", "reverse", "random")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("test order")
    group.addoption("--test-order", choices=ORDERS, default="file",
                    help="the order of the test files and of the tests within each (default: file, as collected)")
    group.addoption("--test-order-seed", type=int, default=None,
                    help="the seed of --test-order=random (default: a new one, printed in the header)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("test_order") == "random" and config.getoption("test_order_seed") is None:
        worker_input = getattr(config, "workerinput", None)  # an xdist worker: the seed its controller drew
        config.option.test_order_seed = (worker_input["test_order_seed"] if worker_input is not None
                                         else random.SystemRandom().randrange(1 << 32))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist's controller gives each worker its seed: every worker must collect the same order."""
    node.workerinput["test_order_seed"] = node.config.getoption("test_order_seed")


def order_line(config: pytest.Config) -> str | None:
    order = config.getoption("test_order")
    if order == "random":
        return f"test order: random, --test-order-seed={config.getoption('test_order_seed')}"
    return None if order == "file" else f"test order: {order}"


def pytest_report_header(config: pytest.Config) -> str | None:
    return order_line(config)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The order again at the end, where `-q` (which drops the header) shows it too."""
    line = order_line(config)
    if line is not None:
        terminalreporter.write_line(line)


def reordered(items: list[pytest.Item], order: str, seed: int | None) -> list[pytest.Item]:
    """`items` grouped by file (in the order the files first appear), the files and each file's tests in `order`."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    groups = list(files.values())
    if order == "reverse":
        groups = [group[::-1] for group in groups[::-1]]
    elif order == "random":
        shuffler = random.Random(seed)
        shuffler.shuffle(groups)
        for group in groups:
            shuffler.shuffle(group)
    return [item for group in groups for item in group]


def reorder(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`items` in the order --test-order asks for (conftest.py's collection hook)."""
    order = config.getoption("test_order")
    if order != "file":
        items[:] = reordered(items, order, config.getoption("test_order_seed"))
