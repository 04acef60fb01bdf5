import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_xpu_exporter import __version__
from exporterproc import RunningExporter
from httpclient import request
from vllm_xpu_exporter.cli import DEFAULT_PORT, build_parser, exporter_journal_selection, parse_options
from vllm_xpu_exporter.argparsing import parse_duration
from vllm_xpu_exporter.flags import format_duration
from vllm_xpu_exporter.http.server import check_distinct_listen_addresses
from vllm_xpu_exporter.sources.logs.entry import normalize_boot

REPO = Path(__file__).resolve().parents[2]
CONTRACT_FLAGS = ["--web.listen-address", "--web.telemetry-path", "--web.config.file",
                  "--collector.levelzero", "--no-collector.levelzero", "--collector.processes",
                  "--no-collector.processes", "--collector.journal", "--no-collector.journal",
                  "--levelzero.library", "--journal.directory", "--journal.file", "--journal.units",
                  "--journal.boot", "--path.procfs", "--path.sysfs", "--log.level", "--log.format"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_xpu_exporter", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=30)


@pytest.mark.fast
def test_defaults_match_the_contract():
    settings = parse_options([])
    assert settings.listen_addresses == (f":{DEFAULT_PORT}",)
    assert settings.telemetry_path == "/metrics"
    assert settings.web_config_file is None
    assert settings.collectors == {"levelzero", "processes", "journal"}
    assert settings.levelzero_library == "libze_loader.so.1"
    assert settings.journal_units == ("vllm*.service",)
    assert settings.journal_boot == "current"
    assert settings.journal_files == ()
    assert settings.procfs == "/proc"
    assert settings.sysfs == "/sys"
    assert (settings.log_level, settings.log_format) == ("info", "logfmt")


@pytest.mark.fast
def test_every_contract_flag_parses_in_both_spellings():
    settings = parse_options([
        "--web.listen-address=[::1]:9999", "--web.telemetry-path", "/m", "--no-collector.journal",
        "--no-collector.processes", "--collector.levelzero", "--levelzero.library=/opt/libze_loader.so.1",
        "--journal.file", "a.journal", "--journal.file=b.journal",
        "--journal.units", "vllm-xpu-*.service", "--journal.units=other.service",
        "--journal.boot", "0123456789ABCDEF0123456789abcdef", "--path.procfs", "/host/proc",
        "--path.sysfs=/host/sys", "--log.level", "debug", "--log.format", "json", "--levelzero.timeout", "1500ms"])
    assert settings.listen_addresses == ("[::1]:9999",)
    assert settings.telemetry_path == "/m"
    assert settings.collectors == {"levelzero"}
    assert settings.levelzero_library == "/opt/libze_loader.so.1"
    # relative to the working directory, made absolute (sd-journal takes absolute paths only)
    assert settings.journal_files == (os.path.abspath("a.journal"), os.path.abspath("b.journal"))
    assert settings.journal_units == ("vllm-xpu-*.service", "other.service")
    assert settings.journal_boot == "0123456789abcdef0123456789abcdef"
    assert settings.procfs == "/host/proc"
    assert settings.sysfs == "/host/sys"
    assert (settings.log_level, settings.log_format) == ("debug", "json")
    assert settings.levelzero_timeout == 1.5


@pytest.mark.fast
def test_journal_directory_parses():
    assert parse_options(["--journal.directory", "/host/var/log/journal"]).journal_directory == \
        "/host/var/log/journal"


@pytest.mark.fast
def test_boot_id_in_dashed_uuid_form_is_normalised():
    assert parse_options(["--journal.boot", "01234567-89ab-cdef-0123-456789abcdef"]).journal_boot == \
        "0123456789abcdef0123456789abcdef"


@pytest.mark.fast
@pytest.mark.parametrize("boot", ["current", "ALL", " all ", "0123456789ABCDEF0123456789abcdef",
                                  "01234567-89ab-cdef-0123-456789abcdef"])
def test_journal_boot_is_normalised_by_the_journal_sources_normaliser(boot):
    assert parse_options(["--journal.boot", boot]).journal_boot == normalize_boot(boot)


@pytest.mark.fast
@pytest.mark.parametrize("boot", ["yesterday", "0123-456789abcdef0123456789abcdef", "0123456789abcdef"])
def test_journal_boot_the_journal_source_refuses_is_refused_at_the_command_line(boot):
    with pytest.raises(ValueError):
        normalize_boot(boot)
    with pytest.raises(SystemExit):
        parse_options(["--journal.boot", boot])


def test_help_lists_every_contract_flag_with_its_default():
    result = run_cli("--help")
    assert result.returncode == 0
    for flag in CONTRACT_FLAGS:
        assert flag in result.stdout, flag
    assert f":{DEFAULT_PORT}" in result.stdout
    assert "libze_loader.so.1" in result.stdout


def test_version_flag_prints_the_package_version():
    result = run_cli("--version")
    assert result.returncode == 0
    assert __version__ in result.stdout


@pytest.mark.parametrize("args, named", [
    (["--log.level", "verbose"], "--log.level"),
    (["--log.format", "xml"], "--log.format"),
    (["--web.listen-address", "nonsense"], "--web.listen-address"),
    (["--web.listen-address", "127.0.0.1:99999"], "--web.listen-address"),
    (["--web.telemetry-path", "metrics"], "--web.telemetry-path"),
    (["--journal.boot", "yesterday"], "--journal.boot"),
    (["--levelzero.timeout", "soon"], "--levelzero.timeout"),
    (["--levelzero.timeout", "0s"], "--levelzero.timeout"),
    (["--levelzero.timeout", "1e300"], "--levelzero.timeout"),  # select() overflows: every scrape failed
    (["--levelzero.timeout", "25h"], "--levelzero.timeout"),
    (["--collector.gpu"], "--collector.gpu"),
    (["--web.config.file", "/nonexistent/web.yml"], "--web.config.file"),
    (["--journal.directory", "/var/log/journal", "--journal.file", "a.journal"], "--journal.file"),
    (["--journal.units", ""], "--journal.units"),
    (["--journal.max-units", "0"], "--journal.max-units"),
    (["--path.sysfs"], "--path.sysfs"),
    (["--web.max-requests", "-1"], "--web.max-requests"),
    (["--path.procfs", "/nonexistent"], "--path.procfs: cannot list /nonexistent: No such file or directory"),
    (["--web.listen-address", "127.0.0.1:9999", "--web.listen-address", "127.0.0.1:9999"],
     "--web.listen-address: listen address 127.0.0.1:9999 given twice"),
    (["--web.listen-address", ":9999", "--web.listen-address", "[::]:9999"],
     "--web.listen-address: listen address [::]:9999 given twice (as :9999)"),
])
def test_bad_input_exits_2_with_one_line_naming_the_problem(args, named):
    result = run_cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert named in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.fast
@pytest.mark.parametrize("argv, enabled", [
    ([], {"levelzero", "journal", "processes"}),
    (["--collector.disable-defaults"], set()),
    (["--collector.disable-defaults", "--collector.journal"], {"journal"}),
    (["--collector.journal", "--collector.disable-defaults", "--collector.levelzero"], {"journal", "levelzero"}),
    (["--no-collector.processes"], {"levelzero", "journal"}),
])
def test_disable_defaults_turns_off_every_collector_not_named(argv, enabled):
    assert parse_options(argv).collectors == enabled


@pytest.mark.fast
def test_web_flags_of_node_exporter_parse():
    defaults = parse_options([])
    assert (defaults.max_requests, defaults.exporter_metrics, defaults.systemd_socket) == (40, True, False)
    options = parse_options(["--web.max-requests=0", "--web.disable-exporter-metrics", "--web.systemd-socket"])
    assert (options.max_requests, options.exporter_metrics, options.systemd_socket) == (0, False, True)


def test_disable_exporter_metrics_leaves_out_the_process_and_python_families_only():
    names = {}
    for flags in ((), ("--web.disable-exporter-metrics",)):
        with RunningExporter(["--collector.disable-defaults", *flags]) as exporter:
            names[flags] = {name for name, _ in exporter.scrape()}
    full, without = names[()], names[("--web.disable-exporter-metrics",)]
    assert {name for name in full - without} == {name for name in full if name.startswith(("process_", "python_"))}
    assert any(name.startswith("process_") for name in full)
    assert "xpu_exporter_build_info" in without and "xpu_exporter_collector_success" not in without


def test_a_busy_second_listen_address_is_named_and_nothing_is_served():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = f"127.0.0.1:{busy.getsockname()[1]}"
        result = run_cli("--web.listen-address", "127.0.0.1:0", "--web.listen-address", taken,
                         "--no-collector.levelzero", "--no-collector.journal", "--no-collector.processes")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (f"vllm-xpu-exporter: error: cannot listen on {taken}: "
                                                       f"Address already in use")


def test_the_same_port_zero_twice_is_two_listeners():
    check_distinct_listen_addresses(["127.0.0.1:0", "127.0.0.1:0"])


@pytest.mark.fast
@pytest.mark.parametrize(("text", "seconds"), [("4s", 4.0), ("500ms", 0.5), ("1m30s", 90.0), ("1.5h", 5400.0),
                                               ("250us", 0.00025), ("2.5", 2.5)])
def test_levelzero_timeout_takes_go_durations_and_bare_seconds(text, seconds):
    assert parse_options(["--levelzero.timeout", text]).levelzero_timeout == pytest.approx(seconds)


@pytest.mark.fast
@pytest.mark.parametrize(("text", "usec"), [("60s", 60_000_000), ("2m", 120_000_000), ("90", 90_000_000)])
def test_journal_engine_grace_is_a_duration_the_exporter_and_the_gate_both_take(text, usec):
    from vllm_xpu_exporter.gate.cli import parse_service_options
    assert parse_options(["--journal.engine-grace", text]).journal_engine_grace_usec == usec
    assert parse_service_options(["--journal.engine-grace", text]).selection.engine_grace_usec == usec
    assert parse_options([]).journal_engine_grace_usec == 60_000_000


@pytest.mark.parametrize("text", ["soon", "0s", "-5s"])
def test_a_bad_journal_engine_grace_exits_2_with_one_line(text):
    result = run_cli("--journal.engine-grace", text)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "--journal.engine-grace" in result.stderr


@pytest.mark.fast
def test_the_exporter_never_watches_its_own_unit_and_says_so_once(caplog):
    options = parse_options(["--journal.engine-grace", "5s"])
    with caplog.at_level("DEBUG", logger="vllm_xpu_exporter.main"):
        selection = exporter_journal_selection(options, own_unit="vllm-xpu-exporter.service")
    assert selection.excluded_units == {"vllm-xpu-exporter.service"} and selection.engine_grace_usec == 5_000_000
    assert not selection.matches_unit("vllm-xpu-exporter.service")
    assert [record.getMessage() for record in caplog.records] == [
        "not watching the exporter's own unit vllm-xpu-exporter.service, which --journal.units matches"]


@pytest.mark.fast
def test_help_shows_every_default_as_written_on_the_command_line_and_explains_every_flag():
    """Durations as durations (4s, not 4.0), switches as on/off, no `(default: None)` or `(default: [])`, and a
    sentence after every flag, the log flags included."""
    parser = build_parser()
    help_text = " ".join(parser.format_help().split())
    assert "(default: None)" not in help_text and "(default: [])" not in help_text
    assert "(default: 4.0)" not in help_text and "--levelzero.timeout DURATION give up" in help_text
    assert "(default: 4s)" in help_text and "(default: 60s)" in help_text and "(default: on)" in help_text
    unexplained = [action.option_strings[0] for action in parser._actions
                   if action.option_strings and not (action.help or "").strip()]
    assert unexplained == []
    assert re.search(r"--log\.level \{[^}]*\} log only", help_text) and re.search(r"--log\.format \{[^}]*\} logfmt", help_text)


@pytest.mark.fast
@pytest.mark.parametrize(("seconds", "written"), [(4.0, "4s"), (60.0, "1m"), (90.0, "1m30s"), (0.25, "250ms"),
                                                  (1.5, "1500ms"), (86400.0, "24h"), (3661.0, "1h1m1s")])
def test_a_default_duration_is_written_as_the_duration_parser_reads_it_back(seconds, written):
    assert format_duration(seconds) == written
    assert parse_duration(written) == seconds


def test_every_listen_address_is_served(tmp_path):
    """exporter-toolkit serves each --web.listen-address; so does the exporter: two addresses, two ports, both
    answering /metrics, both named in the start-up line."""
    with RunningExporter(["--web.listen-address", "127.0.0.1:0", "--no-collector.levelzero",
                          "--no-collector.journal", "--no-collector.processes"]) as exporter:
        line = next(line for line in exporter.stderr.splitlines() if "listening on" in line)
        ports = [int(port) for port in re.findall(r"http://127\.0\.0\.1:(\d+)/metrics", line)]
        assert len(ports) == 2 and ports[0] != ports[1], line
        for port in ports:
            status, _, body = request("127.0.0.1", port, timeout=5)
            assert status == 200 and b"xpu_exporter_build_info" in body
