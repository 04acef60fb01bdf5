"""The collector registry and the scrape: flags made from the registry, sources built for what the enabled
collectors need, and one scrape at a time shared by concurrent requests (in process, against an isolated
prometheus_client CollectorRegistry)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from vllm_xpu_exporter.cli import Options, build_parser, build_sources, needed_sources, parse_options
from vllm_xpu_exporter.collector import Collector, ScrapeContext, Source, Sources, registered
from vllm_xpu_exporter.collectors.processes import ProcessesOptions
from vllm_xpu_exporter.scrape import ExporterCollector

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)


def test_every_registered_collector_has_its_enable_and_disable_flags_and_nothing_else_does():
    """As node_exporter's: `--[no-]collector.NAME` per registered collector, and a collector's own options
    (`--collector.NAME.OPTION`) only for a registered one; and node_exporter's `--collector.disable-defaults`."""
    flags = {option for action in build_parser()._actions for option in action.option_strings
             if option.startswith(("--collector.", "--no-collector."))}
    assert "--collector.disable-defaults" in flags
    flags.discard("--collector.disable-defaults")
    names = [spec.name for spec in registered()]
    assert names == ["journal", "processes", "levelzero"]
    switches = {flag for flag in flags if flag.count(".") == 1}
    assert switches == {f"--{prefix}collector.{name}" for name in names for prefix in ("", "no-")}
    assert {flag.split(".")[1] for flag in flags - switches} <= set(names), flags - switches
    assert all(flag.startswith("--collector.") for flag in flags - switches), flags - switches


def test_collectors_are_enabled_by_their_registered_default_and_disabled_by_their_flag():
    assert parse_options([]).collectors == {spec.name for spec in registered() if spec.enabled_by_default}
    assert parse_options(["--no-collector.journal"]).collectors == {"levelzero", "processes"}


def test_each_collector_gets_only_its_own_options_made_from_the_command_line():
    options = parse_options(["--no-collector.levelzero", "--collector.processes.max-units", "3",
                             "--path.procfs", "/host/proc", "--path.sysfs", "/host/sys"])
    assert options.collector_options == {
        "journal": None, "levelzero": None, "processes": ProcessesOptions(max_units=3, uses_levelzero=False)}
    assert parse_options([]).collector_options["processes"] == ProcessesOptions()
    assert Options().collector_options == parse_options([]).collector_options


def test_sources_are_built_only_for_what_the_enabled_collectors_need():
    options = parse_options(["--no-collector.journal"])
    needs = {need for spec in registered() if spec.name in options.collectors for need in spec.needs}
    sources = build_sources(options, needs)
    assert needs == {Source.LEVELZERO, Source.LEVELZERO_TELEMETRY, Source.DRM_CLIENTS, Source.DMEM,
                     Source.CONTAINER_NAMES, Source.VLLM_ENDPOINTS, Source.UNIT_PLANS}
    assert sources.levelzero is not None and sources.levelzero.telemetry and sources.journal is None
    assert build_sources(options, set()) == Sources()
    only_levelzero = build_sources(parse_options(["--no-collector.journal", "--no-collector.processes"]),
                                   {Source.LEVELZERO_TELEMETRY})
    assert only_levelzero.levelzero is not None
    assert (only_levelzero.drm_clients, only_levelzero.dmem, only_levelzero.container_names,
            only_levelzero.vllm_endpoints) == (None, None, None, None)


def test_the_processes_sources_are_built_once_with_the_host_paths_and_handed_to_the_collector_through_sources():
    """The processes collector owns no source: its DRM clients' scan, dmem reader, containers' names, endpoint
    finder and the plans' drop-ins are built with the other sources, from the host paths and the two flags the
    command line defines for them, and it reads them through the scrape context."""
    options = parse_options(["--no-collector.journal", "--no-collector.levelzero", "--path.procfs", "/host/proc",
                             "--path.sysfs", "/host/sys", "--path.docker", "/host/docker", "--path.podman",
                             "/host/podman", "--path.pods", "/host/pods", "--path.container-logs", "/host/containers",
                             "--collector.processes.sd-host-address", "192.0.2.7",
                             "--collector.processes.plans", "/host/etc/systemd/system"])
    spec = next(spec for spec in registered() if spec.name == "processes")
    sources = build_sources(options, set(spec.needs))
    assert sources.drm_clients is not None and sources.drm_clients.procfs == "/host/proc"
    assert sources.dmem is not None and sources.dmem.root == "/host/sys/fs/cgroup"
    names = sources.container_names
    assert names is not None and names.locations == {
        "docker_roots": ("/host/docker",), "podman_storages": ("/host/podman",), "pod_logs": "/host/pods",
        "container_logs": "/host/containers"}
    endpoints = sources.vllm_endpoints
    assert endpoints is not None and (endpoints.procfs, endpoints.host_address) == ("/host/proc", "192.0.2.7")
    assert sources.unit_plans is not None and sources.unit_plans.directory == "/host/etc/systemd/system"
    collector = spec.factory(options.collector_options["processes"], sources)
    built = (sources.drm_clients, sources.dmem, sources.container_names, sources.vllm_endpoints, sources.unit_plans)
    assert not [value for value in vars(collector).values() if any(value is source for source in built)]


def test_the_levelzero_collector_keeps_no_source_and_reads_the_drm_node_names_through_the_scrape_context():
    """udev's DrmNodeNames is built with Level Zero in cli.build_sources (wired to the worker), not kept by the
    collector."""
    options = parse_options(["--no-collector.journal", "--no-collector.processes"])
    spec = next(spec for spec in registered() if spec.name == "levelzero")
    sources = build_sources(options, set(spec.needs))
    assert sources.levelzero is not None and sources.drm_nodes is not None
    collector = spec.factory(options.collector_options["levelzero"], sources)
    assert not [value for value in vars(collector).values() if value is sources.levelzero or value is sources.drm_nodes]


def test_without_the_levelzero_collector_no_collector_drives_level_zero():
    options = parse_options(["--no-collector.levelzero"])
    assert "processes" in options.collectors
    needs = needed_sources(options)
    assert Source.DRM_CLIENTS in needs and not needs & {Source.LEVELZERO, Source.LEVELZERO_TELEMETRY}
    sources = build_sources(options, needs)
    assert sources.levelzero is None and sources.drm_nodes is None


class Counting(Collector):
    """Takes `seconds` per run and records how many runs overlapped."""

    name = "counting"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.runs = 0
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def collect(self, context: ScrapeContext) -> Iterator[Metric]:
        with self._lock:
            self.runs += 1
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            run = self.runs
        time.sleep(self.seconds)
        with self._lock:
            self.running -= 1
        family = GaugeMetricFamily("test_run", "Which run of the collector this scrape served.")
        family.add_metric([], run)
        yield family


def scrape_concurrently(registry: CollectorRegistry, clients: int) -> list[bytes]:
    start = threading.Barrier(clients)
    bodies: list[bytes] = []

    def client() -> None:
        start.wait()
        bodies.append(generate_latest(registry))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return bodies


def test_concurrent_requests_share_the_scrape_in_flight_and_collectors_run_one_at_a_time():
    collector = Counting(seconds=0.3)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector([collector], Sources()))
    bodies = scrape_concurrently(registry, clients=8)
    assert len(bodies) == 8
    assert collector.most_at_once == 1
    assert collector.runs < 8, "every request ran its own scrape"
    assert all(b"test_run " in body for body in bodies)


def test_a_request_after_a_scrape_ended_gets_a_fresh_scrape():
    collector = Counting(seconds=0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector([collector], Sources()))
    first, second = generate_latest(registry), generate_latest(registry)
    assert b"test_run 1.0" in first and b"test_run 2.0" in second


def module_imports() -> dict[str, set[str]]:
    """The package's modules and the package modules each imports anywhere: at module level, under
    `if TYPE_CHECKING:`, inside functions and methods (the whole tree, not only the module's body); a
    `from vllm_xpu_exporter import x` imports the submodule x, a relative import is resolved against the module's
    package, and importing a submodule imports the packages above it."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    modules: dict[str, set[str]] = {}
    for path in (root / "exporter").rglob("*.py"):
        parts = ("vllm_xpu_exporter", *path.relative_to(root / "exporter").with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        package = name if is_package else name.rpartition(".")[0]
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:  # from . import x, from ..y import z
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    module = f"{base}.{node.module}" if node.module else base
                else:
                    module = node.module or ""
                if module == "vllm_xpu_exporter" or module.startswith("vllm_xpu_exporter."):
                    imported |= {module} | {f"{module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names
                             if alias.name == "vllm_xpu_exporter" or alias.name.startswith("vllm_xpu_exporter.")}
        # importing vllm_xpu_exporter.a.b runs exporter/a/__init__.py first (unless it is a package of the importer's own)
        parents = {other.rsplit(".", depth)[0] for other in imported for depth in range(1, other.count("."))}
        modules[name] = imported | {parent for parent in parents if not name.startswith(f"{parent}.")}
    return {name: {other for other in imported if other in modules and other != name}
            for name, imported in modules.items()}


@pytest.fixture(scope="module")
def package_imports() -> dict[str, set[str]]:
    """module_imports() parsed once for the tests that only read it."""
    return module_imports()


def import_cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The circles of `imports`: its strongly connected components of more than one module (Tarjan's),
    each sorted, so that a failure names every module of a circle, not one path through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for other in sorted(imports[name]):
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = []
            while (member := stack.pop()) != name:
                component.append(member)
            component.append(name)
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(imports):
        if name not in index:
            visit(name)
    return sorted(cycles)


def test_the_cycle_finder_names_every_module_of_a_circle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_collector_imports_another_and_no_module_imports_in_a_cycle(package_imports: dict[str, set[str]]):
    imports = package_imports
    for name, imported in imports.items():
        if name.startswith("vllm_xpu_exporter.collectors."):
            assert not {other for other in imported if other.startswith("vllm_xpu_exporter.collectors")}, name
    cycles = import_cycles(imports)
    assert not cycles, "modules that import each other in a circle: " + "; ".join(", ".join(c) for c in cycles)


# The layers of docs/development/architecture.md, bottom up: a module imports only from its own layer or below, and
# every module has a layer (its longest prefix here names it; the package itself is only its own name).
PACKAGE = "vllm_xpu_exporter"
LAYERS = (
    # shared leaves: the package's version, argument types, durations, PCI spelling, systemd's facts, NoDataYet,
    # the metric families, the process's capability sets, the build's revision
    (PACKAGE, f"{PACKAGE}.argparsing", f"{PACKAGE}.durations", f"{PACKAGE}.pci", f"{PACKAGE}.systemd",
     f"{PACKAGE}.nodatayet", f"{PACKAGE}.families", f"{PACKAGE}.capabilities", f"{PACKAGE}.buildinfo"),
    # the parsers, and the container runtimes' facts and state beside them (the cgroup parser asks their registry)
    (f"{PACKAGE}.parsers", f"{PACKAGE}.runtimes"),
    (f"{PACKAGE}.fold",),
    (f"{PACKAGE}.sources.logs",),
    (f"{PACKAGE}.sources",),
    # the readings reasoned over, pure: who holds what, vLLM's memory rules, the plans, right-sizing, discovery
    # (the planner's package but its command line)
    (f"{PACKAGE}.attribution", f"{PACKAGE}.discovery", f"{PACKAGE}.start_free_memory", f"{PACKAGE}.memory_rules",
     f"{PACKAGE}.planner"),
    (f"{PACKAGE}.collector", f"{PACKAGE}.collectors", f"{PACKAGE}.scrape"),
    # the programs: the exporter's command line, flags and logging, the files it prints, its selfcheck (which reads
    # the journal as the planner does), the web layer, the gate, the planner's command line
    (f"{PACKAGE}.__main__", f"{PACKAGE}.cli", f"{PACKAGE}.flags", f"{PACKAGE}.logformat", f"{PACKAGE}.shipped",
     f"{PACKAGE}.selfcheck", f"{PACKAGE}.http", f"{PACKAGE}.gate", f"{PACKAGE}.planner.cli",
     f"{PACKAGE}.planner.__main__"),
)


def layer_of(module: str) -> int | None:
    """The layer of a module (LAYERS' index, by its longest prefix there); None: a module of no layer."""
    found = [(len(prefix), index) for index, prefixes in enumerate(LAYERS) for prefix in prefixes
             if module == prefix or (prefix != PACKAGE and module.startswith(f"{prefix}."))]
    return max(found)[1] if found else None


def upward_imports(imports: dict[str, set[str]]) -> list[str]:
    """`A imports B` for each import of a module from a layer above its own, and `A has no layer` for each module
    of no layer (so that no module escapes the check)."""
    unlayered = [f"{name} has no layer" for name in imports if layer_of(name) is None]
    upward = [f"{name} imports {other}" for name, imported in imports.items() for other in imported
              if layer_of(name) is not None and layer_of(other) is not None and layer_of(other) > layer_of(name)]
    return sorted(unlayered + upward)


def test_the_layer_check_finds_an_upward_import_and_a_module_of_no_layer():
    assert upward_imports({"vllm_xpu_exporter.fold.engine_starts": {"vllm_xpu_exporter.gate.lines"},
                           "vllm_xpu_exporter.gate.cli": {"vllm_xpu_exporter.parsers.gate"},
                           "vllm_xpu_exporter.gate.lines": set()}) == [
        "vllm_xpu_exporter.fold.engine_starts imports vllm_xpu_exporter.gate.lines"]
    # the breaches this check once let through: a source importing the planner, a collector the command line's flags
    assert upward_imports({"vllm_xpu_exporter.sources.prometheus": {"vllm_xpu_exporter.planner.rightsizing"},
                           "vllm_xpu_exporter.collectors.processes": {"vllm_xpu_exporter.flags"},
                           "vllm_xpu_exporter.planner.rightsizing": set(), "vllm_xpu_exporter.flags": set()}) == [
        "vllm_xpu_exporter.collectors.processes imports vllm_xpu_exporter.flags",
        "vllm_xpu_exporter.sources.prometheus imports vllm_xpu_exporter.planner.rightsizing"]
    # a package's module takes its longest prefix's layer: the planner's command line is a program
    assert upward_imports({"vllm_xpu_exporter.attribution": {"vllm_xpu_exporter.planner.plans",
                                                             "vllm_xpu_exporter.planner.cli"},
                           "vllm_xpu_exporter.planner.plans": set(), "vllm_xpu_exporter.planner.cli": set()}) == [
        "vllm_xpu_exporter.attribution imports vllm_xpu_exporter.planner.cli"]
    assert upward_imports({"vllm_xpu_exporter.newmodule": set(), "vllm_xpu_exporter": set()}) == [
        "vllm_xpu_exporter.newmodule has no layer"]


def test_every_module_has_a_layer_and_imports_only_from_it_and_the_layers_below(
        package_imports: dict[str, set[str]]):
    """The shared leaves, then the parsers, the fold, the log sources' shared package, the sources, the readings
    reasoned over (attribution, the memory rules, the plans, right-sizing, discovery), the collectors and the
    scrape, then the programs (the command line, the web layer, the gate, the planner): never upwards (the fold
    reads the gate's lines through their parser, parsers/gate.py, not through the gate's package), and no module
    outside the layers."""
    assert upward_imports(package_imports) == []


def test_the_log_sources_share_only_the_neutral_log_package(package_imports: dict[str, set[str]]):
    """The journal and the containers' log files both import sources/logs/ (the entries, the selection, the
    follower); it imports neither, and neither imports the other."""
    imports = package_imports
    journal = {name for name in imports if name.startswith("vllm_xpu_exporter.sources.journal")}
    container_logs = {"vllm_xpu_exporter.sources.containerlogs"}
    neutral = {name for name in imports if name.startswith("vllm_xpu_exporter.sources.logs")}
    assert neutral and journal

    def imported_by(modules: set[str]) -> set[str]:
        return set().union(*(imports[name] for name in modules))

    assert not imported_by(neutral) & (journal | container_logs)
    assert not imported_by(journal) & container_logs
    assert not imported_by(container_logs) & journal
    assert imported_by(journal) & neutral and imported_by(container_logs) & neutral


def test_the_follower_reads_both_logs_through_one_reader_protocol():
    """The journal's reader and the containers' log files' reader are both the follower's `LogReader` (what it
    calls of a reader is typed, not `Any`); a reader lacking part of it is not one."""
    from vllm_xpu_exporter.sources.containerlogs import ContainerLogReader, LogDirectories
    from vllm_xpu_exporter.sources.journal import JournalReader, JournalSelection
    from vllm_xpu_exporter.sources.logs.entry import LogSelection
    from vllm_xpu_exporter.sources.logs.follower import LogReader

    assert isinstance(JournalReader(JournalSelection()), LogReader)
    assert isinstance(ContainerLogReader(LogSelection(), LogDirectories()), LogReader)

    class WithoutLatestInvocations:
        unreadable_entries, last_unreadable, rejected_entries = 0, None, {}
        open = close = wait = read_available = __enter__ = __exit__ = lambda *args: None

    assert not isinstance(WithoutLatestInvocations(), LogReader)
