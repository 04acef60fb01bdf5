"""The NixOS module (nix/module.nix) and package (nix/package.nix).

Both are parsed by Debian's Nix (`nix-instantiate --parse`). nixpkgs is not on this machine, so the
module is also evaluated by the real Nix evaluator with a minimal stand-in for the few `lib`, `pkgs`
and `utils` functions it calls (written out below, `utils.escapeSystemdExecArgs` as in NixOS), which
checks what the module produces: the same service as packaging/vllm-xpu-exporter.service, and flags the
exporter accepts."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from vllm_xpu_exporter import __version__
from vllm_xpu_exporter.sources import plan_dropins
from vllm_xpu_exporter.cli import parse_options
from vllm_xpu_exporter.gate.cli import parse_client_options, parse_service_options

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "nix" / "module.nix"
PACKAGE = REPO / "nix" / "package.nix"
UNIT = REPO / "packaging" / "vllm-xpu-exporter.service"
STORE_PATH = "/nix/store/00000000000000000000000000000000-vllm-xpu-exporter"
SYSTEMD_STORE_PATH = "/nix/store/11111111111111111111111111111111-systemd"
COREUTILS_STORE_PATH = "/nix/store/33333333333333333333333333333333-coreutils"
# Options that never had the former name services.xpu-exporter.
OPTIONS_ADDED_AFTER_THE_RENAME = {"gate", "plan", "socketActivation"}
# No build users on this machine; evaluation needs none.
NIX_ENV = {**os.environ, "NIX_CONFIG": "build-users-group ="}

STAND_IN_LIB = """
  lib = rec {
    mkEnableOption = name: { _type = "option"; default = false; description = "Whether to enable ${name}."; };
    mkOption = attrs: attrs // { _type = "option"; };
    mkIf = condition: content: if condition then content else { };
    mkRenamedOptionModule = from: to: { _type = "renamedOptionModule"; inherit from to; };
    mkOrder = priority: content: { _type = "order"; inherit priority content; };
    mkAfter = mkOrder 1500;
    mkDefault = content: { _type = "override"; priority = 1000; inherit content; };
    optionals = condition: list: if condition then list else [ ];
    optionalAttrs = condition: attrs: if condition then attrs else { };
    mapAttrs' = f: attrs: builtins.listToAttrs (map (name: f name attrs.${name}) (builtins.attrNames attrs));
    removeSuffix = suffix: text:
      let n = builtins.stringLength suffix; m = builtins.stringLength text; in
      if m >= n && builtins.substring (m - n) n text == suffix then builtins.substring 0 (m - n) text else text;
    literalExpression = text: { _type = "literalExpression"; inherit text; };
    hasInfix = infix: content:
      let
        n = builtins.stringLength infix;
        at = i: i + n <= builtins.stringLength content && (builtins.substring i n content == infix || at (i + 1));
      in at 0;
    types = {
      bool = "bool"; package = "package"; port = "port"; str = "str";
      listOf = type: "listOf"; nonEmptyListOf = type: "nonEmptyListOf"; nullOr = type: "nullOr";
      enum = values: "enum"; ints.positive = "ints.positive"; attrs = "attrs"; attrsOf = type: "attrsOf";
    };
    cleanSource = path: "source";
    makeLibraryPath = packages: builtins.concatStringsSep ":" (map (package: "${package}/lib") packages);
    licenses.asl20 = "asl20";
    platforms.linux = [ "x86_64-linux" ];
  };
"""

MODULE_HARNESS = """
{ overrides, part ? "config" }:
let
%(lib)s
  # nixos/lib/utils.nix
  utils.escapeSystemdExecArgs = args: builtins.concatStringsSep " "
    (map (arg: builtins.replaceStrings [ "%%" "$" ] [ "%%%%" "$$" ] (builtins.toJSON (toString arg))) args);
  pkgs.callPackage = path: args: { outPath = "%(store)s"; };
  pkgs.systemd = { outPath = "%(systemd)s"; };
  pkgs.coreutils = { outPath = "%(coreutils)s"; };
  evaluated = import %(module)s { inherit config lib pkgs utils; };
  # The options' defaults (option sets nested, as gate.*), with the overrides merged in recursively.
  defaults = options: builtins.mapAttrs
    (name: option: if option._type or null == "option" then option.default else defaults option) options;
  merge = base: top: base // builtins.mapAttrs
    (name: value: if builtins.isAttrs value && builtins.isAttrs (base.${name} or null) then merge base.${name} value
                  else value) top;
  config.services.vllm-xpu-exporter = merge (defaults evaluated.options.services.vllm-xpu-exporter) overrides;
in {
  config = evaluated.config;
  renames = { imports = evaluated.imports; options = builtins.attrNames evaluated.options.services.vllm-xpu-exporter; };
}.${part}
"""

PACKAGE_HARNESS = """
let
%(lib)s
  python3Packages = {
    buildPythonApplication = attrs: attrs;
    setuptools = "setuptools"; prometheus-client = "prometheus-client"; pyudev = "pyudev";
    pyyaml = "pyyaml"; bcrypt = "bcrypt";
  };
in import %(package)s { inherit lib python3Packages; level-zero = "/nix/store/level-zero"; systemd = "/nix/store/systemd"; }
"""


def nix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nix-instantiate", *args], capture_output=True, text=True, timeout=60, env=NIX_ENV)


def evaluate_module(tmp_path: Path, overrides: str = "{ enable = true; }", part: str = "config") -> dict:
    harness = tmp_path / "module-harness.nix"
    harness.write_text(MODULE_HARNESS % {"lib": STAND_IN_LIB, "store": STORE_PATH, "systemd": SYSTEMD_STORE_PATH,
                                         "coreutils": COREUTILS_STORE_PATH,
                                         "module": MODULE})
    result = nix("--eval", "--strict", "--json", str(harness), "--arg", "overrides", overrides,
                 "--argstr", "part", part)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def service_config(tmp_path: Path, overrides: str = "{ enable = true; }") -> dict:
    return evaluate_module(tmp_path, overrides)["systemd"]["services"]["vllm-xpu-exporter"]["serviceConfig"]


def unit_sections(text: str) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
        elif "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            current.setdefault(key, []).append(value)
    return sections


def tokens(value: object) -> list[str]:
    """A directive's value as systemd reads it: words, from one line or several."""
    if isinstance(value, bool):
        return ["yes" if value else "no"]
    if isinstance(value, list):
        return [word for item in value for word in tokens(item)]
    return str(value).split()


@pytest.mark.parametrize("path", [MODULE, PACKAGE], ids=lambda path: path.name)
def test_nix_files_parse(path):
    result = nix("--parse", str(path))
    assert result.returncode == 0, result.stderr


def test_parse_reports_a_syntax_error(tmp_path):
    broken = tmp_path / "module.nix"
    broken.write_text(MODULE.read_text().replace("in\n{", "in\n{{", 1))
    assert nix("--parse", str(broken)).returncode != 0


def test_module_produces_the_hardened_unit_of_packaging(tmp_path):
    module = service_config(tmp_path)
    unit = unit_sections(UNIT.read_text())["Service"]
    # The module passes flags directly, without /etc/default/vllm-xpu-exporter; NixOS has no /bin/kill.
    expected = {key: tokens(values) for key, values in unit.items() if key not in ("ExecStart", "EnvironmentFile")}
    expected["ExecReload"] = [tokens(unit["ExecReload"])[0].replace("/bin/kill", f"{COREUTILS_STORE_PATH}/bin/kill"),
                              *tokens(unit["ExecReload"])[1:]]
    produced = {key: tokens(value) for key, value in module.items() if key != "ExecStart"}
    assert produced == expected
    assert produced["ExecReload"] == [f"{COREUTILS_STORE_PATH}/bin/kill", "-HUP", "$MAINPID"]  # systemctl reload


def test_module_orders_the_service_like_the_unit(tmp_path):
    service = evaluate_module(tmp_path)["systemd"]["services"]["vllm-xpu-exporter"]
    unit = unit_sections(UNIT.read_text())
    assert service["after"] == tokens(unit["Unit"]["After"])
    assert service["wantedBy"] == tokens(unit["Install"]["WantedBy"])


def exec_start_arguments(config: dict) -> list[str]:
    argv = shlex.split(config["ExecStart"].replace("%%", "%").replace("$$", "$"))
    assert argv[0] == f"{STORE_PATH}/bin/vllm-xpu-exporter"
    return argv[1:]


def test_module_defaults_give_the_exporters_defaults(tmp_path):
    settings = parse_options(exec_start_arguments(service_config(tmp_path)))
    assert settings.listen_addresses == (":10447",)
    assert settings.journal_units == ("vllm*.service",)
    assert settings.web_config_file is None


def test_module_options_become_flags_the_exporter_accepts(tmp_path):
    config = service_config(tmp_path, """{
      enable = true; listenAddress = "::1"; port = 9999;
      units = [ "vllm-*.service" "llm@*.service" ];
      webConfigFile = "/etc/vllm-xpu-exporter/web.yml";
      extraFlags = [ "--log.level=debug" "--journal.boot=all" ];
    }""")
    settings = parse_options(exec_start_arguments(config))
    assert settings.listen_addresses == ("[::1]:9999",)
    assert settings.journal_units == ("vllm-*.service", "llm@*.service")
    assert settings.web_config_file == "/etc/vllm-xpu-exporter/web.yml"
    assert (settings.log_level, settings.journal_boot) == ("debug", "all")


def test_module_escapes_systemd_specifiers_in_flags(tmp_path):
    config = service_config(tmp_path, '{ enable = true; units = [ "vllm-%i-$HOST.service" ]; }')
    assert '"--journal.units=vllm-%%i-$$HOST.service"' in config["ExecStart"]
    assert parse_options(exec_start_arguments(config)).journal_units == ("vllm-%i-$HOST.service",)


def test_module_opens_the_firewall_only_when_asked(tmp_path):
    assert evaluate_module(tmp_path)["networking"]["firewall"]["allowedTCPPorts"] == []
    opened = evaluate_module(tmp_path, "{ enable = true; openFirewall = true; port = 9999; }")
    assert opened["networking"]["firewall"]["allowedTCPPorts"] == [9999]


def test_module_runs_as_a_named_user_instead_of_a_dynamic_one_when_given(tmp_path):
    config = service_config(tmp_path, '{ enable = true; user = "vllm-xpu-exporter"; }')
    assert config["User"] == "vllm-xpu-exporter" and "DynamicUser" not in config
    assert service_config(tmp_path)["DynamicUser"] is True


def test_every_option_of_the_former_name_keeps_it_as_a_renamed_alias(tmp_path):
    renames = evaluate_module(tmp_path, part="renames")
    assert renames["options"], "the module declares no options"
    assert sorted((rename["from"], rename["to"]) for rename in renames["imports"]) == sorted(
        (["services", "xpu-exporter", option], ["services", "vllm-xpu-exporter", option])
        for option in renames["options"] if option not in OPTIONS_ADDED_AFTER_THE_RENAME)


GATE_UNIT = REPO / "packaging" / "vllm-xpu-gate.service"
GATE_SOCKET = REPO / "packaging" / "vllm-xpu-gate.socket"


def client_arguments(command: str) -> list[str]:
    """The client's argv of an ExecStartPre= line, as systemd runs it: no prefix (the unit's own user)."""
    assert not command.startswith(("+", "!", "-", "@", ":")), command
    argv = shlex.split(command.replace("%%", "%").replace("$$", "$"))
    assert argv[:2] == [f"{STORE_PATH}/bin/vllm-xpu-gate", "wait"]
    return argv[2:]


def test_gate_units_get_the_client_as_last_exec_start_pre_the_socket_and_a_start_timeout_covering_it(tmp_path):
    config = evaluate_module(tmp_path, """{
      enable = true; units = [ "vllm-*.service" "llm@*.service" ];
      gate = { units = [ "vllm-chat" "vllm-embedding.service" ]; timeoutSec = 300; onTimeout = "fail";
               extraFlags = [ "--gpu-memory-utilization=0.75" ]; };
    }""")
    services = config["systemd"]["services"]
    assert sorted(services) == ["vllm-chat", "vllm-embedding", "vllm-xpu-exporter", "vllm-xpu-gate"]
    for name in ("vllm-chat", "vllm-embedding"):
        service = services[name]["serviceConfig"]
        assert service["ExecStartPre"]["_type"] == "order" and service["ExecStartPre"]["priority"] == 1500  # mkAfter
        (command,) = service["ExecStartPre"]["content"]
        options = parse_client_options(client_arguments(command))
        assert (options.request.timeout, options.request.start_on_timeout, options.request.gpu_memory_utilization,
                options.service_timeout) == (300.0, False, 0.75, 30.0)
        assert services[name]["wants"] == ["vllm-xpu-gate.socket", "vllm-xpu-gate.service"]
        assert services[name]["after"] == ["vllm-xpu-gate.socket"]
        assert service["TimeoutStartSec"] == {"_type": "override", "priority": 1000, "content": 300 + 30 + 90}
    serve = services["vllm-xpu-gate"]["serviceConfig"]["ExecStart"]
    argv = shlex.split(serve)
    assert argv[:2] == [f"{STORE_PATH}/bin/vllm-xpu-gate", "serve"]
    assert parse_service_options(argv[2:]).selection.unit_globs == ("vllm-*.service", "llm@*.service")


def test_gate_defaults_wait_ten_minutes_then_start_and_need_no_exporter(tmp_path):
    config = evaluate_module(tmp_path, '{ gate.units = [ "vllm-chat.service" ]; }')
    assert sorted(config["systemd"]["services"]) == ["vllm-chat", "vllm-xpu-gate"]
    assert config["networking"]["firewall"]["allowedTCPPorts"] == []
    service = config["systemd"]["services"]["vllm-chat"]["serviceConfig"]
    options = parse_client_options(client_arguments(service["ExecStartPre"]["content"][0]))
    assert (options.request.timeout, options.request.start_on_timeout) == (600.0, True)
    assert service["TimeoutStartSec"]["content"] == 720


def test_the_gate_service_and_socket_are_the_packaged_ones(tmp_path):
    config = evaluate_module(tmp_path, '{ gate.units = [ "vllm-chat.service" ]; }')
    module = config["systemd"]["services"]["vllm-xpu-gate"]["serviceConfig"]
    unit = unit_sections(GATE_UNIT.read_text())["Service"]
    expected = {key: tokens(values) for key, values in unit.items() if key not in ("ExecStart", "EnvironmentFile")}
    assert {key: tokens(value) for key, value in module.items() if key != "ExecStart"} == expected
    socket = unit_sections(GATE_SOCKET.read_text())["Socket"]
    assert {key: tokens(value) for key, value in config["systemd"]["sockets"]["vllm-xpu-gate"]["socketConfig"].items()
            } == {key: tokens(values) for key, values in socket.items()}


def test_the_plans_values_go_to_root_files_the_exporter_reads_as_the_planners_drop_ins(tmp_path):
    """`plan` (the values of vllm-xpu-plan --format nixos): each unit's budget in a copied file (mode 0444, not a
    link into the store) named and written as the planner's drop-in, under the directory the exporter is given."""
    (tmp_path / "vllm-xpu-plan.nix").write_text(
        "# vllm-xpu-plan: per vLLM unit, the KV budget and the gpu_memory_utilization beside it\n{\n"
        '  "vllm-xpu-chat" = { kvCacheMemoryBytes = 3481927680; gpuMemoryUtilization = 0.7373; };\n'
        '  "vllm-xpu-embedding" = { kvCacheMemoryBytes = 939524096; gpuMemoryUtilization = 0.0712; };\n}\n')
    config = evaluate_module(tmp_path, f"{{ enable = true; plan = import {tmp_path}/vllm-xpu-plan.nix; }}")
    files = config["environment"]["etc"]
    assert sorted(files) == [f"vllm-xpu-plan/{unit}.d/{plan_dropins.DROP_IN_NAME}"
                             for unit in ("vllm-xpu-chat.service", "vllm-xpu-embedding.service")]
    budgets = {name.split("/")[1].removesuffix(".d"): plan_dropins.parse_drop_in(file["text"]) for name, file in files.items()}
    assert budgets == {"vllm-xpu-chat.service": 3481927680, "vllm-xpu-embedding.service": 939524096}
    assert {file["mode"] for file in files.values()} == {"0444"}
    argv = shlex.split(config["systemd"]["services"]["vllm-xpu-exporter"]["serviceConfig"]["ExecStart"])
    assert parse_options(argv[1:]).plans_directory == "/etc/vllm-xpu-plan"
    assert "--collector.processes.plans" not in service_config(tmp_path)["ExecStart"]  # no plan, the default


def test_disabled_module_adds_nothing(tmp_path):
    assert evaluate_module(tmp_path, "{ }") == {}


def test_package_builds_this_version_with_the_projects_dependencies(tmp_path):
    harness = tmp_path / "package-harness.nix"
    harness.write_text(PACKAGE_HARNESS % {"lib": STAND_IN_LIB, "package": PACKAGE})
    result = nix("--eval", "--strict", "--json", str(harness))
    assert result.returncode == 0, result.stderr
    package = json.loads(result.stdout)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert package["pname"] == project["name"] and package["version"] == __version__
    wanted = {re.split(r"[<>=!~ ;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")
              for requirement in project["dependencies"]}
    assert set(package["dependencies"]) == wanted
    assert package["meta"]["mainProgram"] in project["scripts"]
    assert "/nix/store/level-zero/lib" in " ".join(package["makeWrapperArgs"])


def test_with_a_plan_the_gate_service_reads_its_files_and_each_planned_gated_units_client_gets_its_figures(tmp_path):
    """As the planner's systemd drop-in does: the service is given the plans' directory (--plans), a gated unit
    with a plan its R and budget in its environment (the client's defaults), one without a plan nothing."""
    (tmp_path / "vllm-xpu-plan.nix").write_text(
        '{\n  "vllm-xpu-chat" = { kvCacheMemoryBytes = 3481927680; gpuMemoryUtilization = 0.7373; };\n}\n')
    config = evaluate_module(tmp_path, f"""{{ enable = true; plan = import {tmp_path}/vllm-xpu-plan.nix;
      gate.units = [ "vllm-xpu-chat.service" "vllm-xpu-stt" ]; }}""")
    services = config["systemd"]["services"]
    argv = shlex.split(services["vllm-xpu-gate"]["serviceConfig"]["ExecStart"])
    assert parse_service_options(argv[2:]).plans == "/etc/vllm-xpu-plan"
    environ = services["vllm-xpu-chat"]["environment"]
    options = parse_client_options(client_arguments(services["vllm-xpu-chat"]["serviceConfig"]["ExecStartPre"]
                                                    ["content"][0]), environ)
    assert (options.request.gpu_memory_utilization, options.request.kv_cache_memory_bytes) == (0.7373, 3481927680)
    assert services["vllm-xpu-stt"].get("environment", {}) == {}


EXPORTER_SOCKET = REPO / "packaging" / "vllm-xpu-exporter.socket"
EXPORTER_SOCKET_DROP_IN = REPO / "packaging" / "vllm-xpu-exporter-socket.conf"


def test_socket_activation_gives_the_packaged_socket_and_the_service_its_flag_and_order(tmp_path):
    """socketActivation.enable: the socket of packaging/vllm-xpu-exporter.socket (its [Socket] and install), and the
    service as the packaged drop-in makes it: requiring and after the socket, serving what it is handed
    (--web.systemd-socket) instead of binding an address of its own."""
    config = evaluate_module(tmp_path, "{ enable = true; socketActivation.enable = true; }")
    packaged = unit_sections(EXPORTER_SOCKET.read_text())
    socket = config["systemd"]["sockets"]["vllm-xpu-exporter"]
    assert {key: tokens(value) for key, value in socket["socketConfig"].items()} == {
        key: tokens(values) for key, values in packaged["Socket"].items()}
    assert socket["wantedBy"] == tokens(packaged["Install"]["WantedBy"])
    assert socket["description"] == packaged["Unit"]["Description"][0]
    service = config["systemd"]["services"]["vllm-xpu-exporter"]
    drop_in = unit_sections(EXPORTER_SOCKET_DROP_IN.read_text())["Unit"]
    assert service["requires"] == tokens(drop_in["Requires"])
    assert set(tokens(drop_in["After"])) <= set(service["after"])
    arguments = exec_start_arguments(service["serviceConfig"])
    assert "--web.systemd-socket" in arguments and not any(a.startswith("--web.listen-address") for a in arguments)
    assert parse_options(arguments).systemd_socket


def test_socket_activation_listens_where_the_service_would_or_on_each_stream_given(tmp_path):
    def streams(overrides: str) -> list[str]:
        config = evaluate_module(tmp_path, overrides)
        return config["systemd"]["sockets"]["vllm-xpu-exporter"]["socketConfig"]["ListenStream"]

    assert streams('{ enable = true; socketActivation.enable = true; listenAddress = "::1"; port = 9999; }') == [
        "[::1]:9999"]
    assert streams('{ enable = true; socketActivation.enable = true; socketActivation.listenStreams = '
                   '[ "127.0.0.1:10447" "[::1]:10447" ]; }') == ["127.0.0.1:10447", "[::1]:10447"]


def test_without_socket_activation_there_is_no_exporter_socket_and_the_service_binds_its_address(tmp_path):
    config = evaluate_module(tmp_path)
    assert "vllm-xpu-exporter" not in config["systemd"]["sockets"]
    service = config["systemd"]["services"]["vllm-xpu-exporter"]
    assert service["requires"] == []
    assert not parse_options(exec_start_arguments(service["serviceConfig"])).systemd_socket


def test_the_modules_units_name_the_documentation_the_package_installs_as_the_packaged_units_do(tmp_path):
    """Each unit's documentation is the packaged unit's Documentation=, in the Nix package instead of the venv."""
    config = evaluate_module(tmp_path, '{ enable = true; socketActivation.enable = true; gate.units = [ "vllm-chat" ]; }')
    units = {"vllm-xpu-exporter.service": config["systemd"]["services"]["vllm-xpu-exporter"],
             "vllm-xpu-exporter.socket": config["systemd"]["sockets"]["vllm-xpu-exporter"],
             "vllm-xpu-gate.service": config["systemd"]["services"]["vllm-xpu-gate"],
             "vllm-xpu-gate.socket": config["systemd"]["sockets"]["vllm-xpu-gate"]}
    for name, unit in units.items():
        packaged = unit_sections((REPO / "packaging" / name).read_text())["Unit"]["Documentation"]
        assert unit["documentation"] == [uri.replace("/opt/vllm-xpu-exporter", STORE_PATH) for uri in packaged], name
