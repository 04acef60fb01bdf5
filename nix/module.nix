# NixOS module of vllm-xpu-exporter: the hardened service of packaging/vllm-xpu-exporter.service.
#
#   imports = [ ./vllm-xpu-exporter/nix/module.nix ];
#   services.vllm-xpu-exporter = {
#     enable = true;
#     units = [ "vllm-*.service" ];
#     openFirewall = true;
#   };
#   hardware.graphics.enable = true;
#   hardware.graphics.extraPackages = [ pkgs.intel-compute-runtime ];  # Intel's Level Zero GPU driver
#
# docs/deployment.md ("NixOS") has the Prometheus side: scrape job, bundled rules and dashboards.
#
# The init gate (docs/gate.md) on vLLM units of this host, with or without the exporter: the gate service
# and its socket, and the client in each listed unit:
#
#   services.vllm-xpu-exporter.gate.units = [ "vllm-chat" "vllm-embedding.service" ];
#
# Socket activation, as the packaged vllm-xpu-exporter.socket: systemd holds the listening sockets from early
# boot and hands them to the exporter (--web.systemd-socket); a restart refuses no connection:
#
#   services.vllm-xpu-exporter.socketActivation.enable = true;
#   services.vllm-xpu-exporter.socketActivation.listenStreams = [ "127.0.0.1:10447" "[::1]:10447" ];
#
# The planner's values (vllm-xpu-plan --format nixos, docs/planner.md), given to the units' own module and
# here, so that the exporter knows each unit's plan and alerts when the unit does not run with it:
#
#   services.vllm-xpu-exporter.plan = import /etc/nixos/vllm-xpu-plan.nix;
{ config, lib, pkgs, utils, ... }:

let
  cfg = config.services.vllm-xpu-exporter;
  inherit (lib) mkAfter mkDefault mkEnableOption mkIf mkOption mkRenamedOptionModule optionalAttrs optionals removeSuffix types;

  # IPv6 literals go in brackets: [::1]:10447.
  listenHost = if lib.hasInfix ":" cfg.listenAddress then "[${cfg.listenAddress}]" else cfg.listenAddress;

  # The exporter and the gate service read the same units from the journal.
  journalUnitFlags = map (glob: "--journal.units=${glob}") cfg.units;

  # Socket activation: the socket unit's ListenStream= values, by default the address and port the service
  # would bind itself.
  socketActivated = cfg.socketActivation.enable;
  listenStreams = if cfg.socketActivation.listenStreams != [ ] then cfg.socketActivation.listenStreams
    else if cfg.listenAddress == "" then [ (toString cfg.port) ] else [ "${listenHost}:${toString cfg.port}" ];

  flags =
    (if socketActivated then [ "--web.systemd-socket" ] else [ "--web.listen-address=${listenHost}:${toString cfg.port}" ])
    ++ journalUnitFlags
    ++ optionals (cfg.webConfigFile != null) [ "--web.config.file=${cfg.webConfigFile}" ]
    ++ optionals (cfg.plan != { }) [ "--collector.processes.plans=/etc/${plansDirectory}" ]
    ++ cfg.extraFlags;

  # CAP_PERFMON: real device memory usage (without it i915/xe report free == total).
  # CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH: other users' /proc/PID/fd and fdinfo (per-unit memory).
  # All three are kept only by the services' privileged reader child; the serving processes drop them at
  # start (docs/security.md).
  capabilities = [ "CAP_PERFMON" "CAP_SYS_PTRACE" "CAP_DAC_READ_SEARCH" ];

  # The gate's client is a gated unit's last ExecStartPre= command, right before its main process, run
  # as the unit's own user (no "+"): it asks the gate service over its socket and says nothing of which
  # unit it is (the service reads that from the caller's cgroup).
  gateClientFlags =
    [ "--timeout=${toString cfg.gate.timeoutSec}s" "--on-timeout=${cfg.gate.onTimeout}"
      "--service-timeout=${toString cfg.gate.serviceTimeoutSec}s" ]
    ++ cfg.gate.extraFlags;
  gateCommand = utils.escapeSystemdExecArgs ([ "${cfg.package}/bin/vllm-xpu-gate" "wait" ] ++ gateClientFlags);
  gatedServices = builtins.listToAttrs (map (unit: {
    name = removeSuffix ".service" unit;
    value = {
      # The service too (not after it): it starts beside the unit, not at the client's connection.
      wants = [ "vllm-xpu-gate.socket" "vllm-xpu-gate.service" ];
      after = [ "vllm-xpu-gate.socket" ];
      # The plan's figures for the client (as the planner's systemd drop-in gives them): the service admits a
      # start by its budget only when the plan's file names it too (--plans).
      environment = optionalAttrs (builtins.hasAttr (removeSuffix ".service" unit) cfg.plan) (let
        values = cfg.plan.${removeSuffix ".service" unit};
      in {
        VLLM_XPU_GATE_KV_CACHE_MEMORY_BYTES = toString values.kvCacheMemoryBytes;
        VLLM_XPU_GATE_GPU_MEMORY_UTILIZATION = toString values.gpuMemoryUtilization;
      });
      serviceConfig = {
        ExecStartPre = mkAfter [ gateCommand ];
        # The wait counts against the start: the client's timeout and service timeout plus the unit's own start.
        TimeoutStartSec = mkDefault (cfg.gate.timeoutSec + cfg.gate.serviceTimeoutSec + cfg.gate.startTimeoutSec);
      };
    };
  }) cfg.gate.units);

  # The budget the plan gives each unit, in a file of root's (a copy, mode 0444, not a link into the store) as
  # the planner's systemd drop-in names it: the exporter reads it (xpu_unit_kv_cache_plan_bytes) and alerts
  # when the unit's latest start ran with another (XpuUnitPlanNotApplied). The units' own module applies it.
  plansDirectory = "vllm-xpu-plan";
  planFiles = lib.mapAttrs' (name: values: {
    name = "${plansDirectory}/${removeSuffix ".service" name}.service.d/zz-vllm-xpu-plan.conf";
    value = {
      mode = "0444";
      text = "# ${name}: the budget of vllm-xpu-plan's values (services.vllm-xpu-exporter.plan)\n"
        + "LogExtraFields=VLLM_XPU_PLAN_KV_CACHE_MEMORY_BYTES=${toString values.kvCacheMemoryBytes}\n";
    };
  }) cfg.plan;

  # The documentation the package installs (the wheel's data files), as the packaged units' Documentation= name it
  # under their venv: the project has no web address
  docs = "${cfg.package}/share/doc/vllm-xpu-exporter";
  exporterDocumentation = [ "file://${docs}/README.md" "file://${docs}/docs/deployment.md" ];
  gateDocumentation = [ "file://${docs}/docs/gate.md" ];

  # The exporter's and the gate service's sandbox: a transient user, the render and journal groups, the
  # capabilities above, and nothing else.
  hardening = {
    SupplementaryGroups = [ "render" "systemd-journal" ];
    UMask = "0077";

    AmbientCapabilities = capabilities;
    CapabilityBoundingSet = capabilities;
    NoNewPrivileges = true;
    SecureBits = "noroot-locked";

    ProtectSystem = "strict";
    ProtectHome = true;
    InaccessiblePaths = [
      "-/etc/shadow" "-/etc/gshadow" "-/etc/shadow-" "-/etc/gshadow-" "-/etc/ssh" "-/etc/ssl/private"
      "-/var/lib/private"
    ];
    PrivateTmp = true;
    PrivateIPC = true;
    PrivateUsers = false;
    RemoveIPC = true;
    PrivateMounts = true;

    DevicePolicy = "closed";
    DeviceAllow = [ "char-drm rw" ];

    ProtectKernelTunables = true;
    ProtectKernelModules = true;
    ProtectKernelLogs = true;
    ProtectControlGroups = true;
    ProtectClock = true;
    ProtectHostname = true;
    ProtectProc = "default";
    ProcSubset = "all";

    RestrictNamespaces = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    LockPersonality = true;
    MemoryDenyWriteExecute = true;
    SystemCallArchitectures = "native";
    SystemCallFilter = [ "@system-service" "~@privileged" ];
    SystemCallErrorNumber = "EPERM";
  };

  gateService = {
    description = "Init gate of vLLM units (vllm-xpu-gate)";
    documentation = gateDocumentation;
    requires = [ "vllm-xpu-gate.socket" ];
    after = [ "vllm-xpu-gate.socket" "systemd-journald.service" ];
    serviceConfig = hardening // {
      Type = "exec";
      ExecStart = utils.escapeSystemdExecArgs
        ([ "${cfg.package}/bin/vllm-xpu-gate" "serve" ] ++ journalUnitFlags
          ++ optionals (cfg.plan != { }) [ "--plans=/etc/${plansDirectory}" ] ++ cfg.gate.serviceExtraFlags);
      Restart = "on-failure";
      RestartSec = "1s";
      RestartPreventExitStatus = 2;
      # Its leases (leases.json): they outlive a restart of the service, until the next boot.
      RuntimeDirectory = "vllm-xpu-gate-leases";
      RuntimeDirectoryMode = "0700";
      RuntimeDirectoryPreserve = "yes";
      DynamicUser = true;
      PrivateNetwork = true;
      RestrictAddressFamilies = [ "AF_UNIX" ];
      MemoryMax = "256M";
      TasksMax = 512;
    };
  };

  gateSocket = {
    description = "Socket of the init gate of vLLM units (vllm-xpu-gate)";
    documentation = gateDocumentation;
    wantedBy = [ "sockets.target" ];
    socketConfig = {
      ListenStream = "/run/vllm-xpu-gate/gate.sock";
      SocketMode = "0666";
      DirectoryMode = "0755";
      RemoveOnStop = true;
    };
  };

  # The exporter's socket, as packaging/vllm-xpu-exporter.socket
  exporterSocket = {
    description = "Socket of the Prometheus exporter for Intel GPUs shared by vLLM units (vllm-xpu-exporter)";
    documentation = exporterDocumentation;
    wantedBy = [ "sockets.target" ];
    socketConfig = {
      ListenStream = listenStreams;
      # the exporter serves every socket it is given itself: one service for all connections
      Accept = false;
    };
  };

  # Options of the module's former name, services.xpu-exporter, kept as aliases with a rename warning.
  formerOptions = [ "enable" "package" "port" "listenAddress" "units" "webConfigFile" "extraFlags" "openFirewall" "user" ];
in
{
  imports = map (option: mkRenamedOptionModule [ "services" "xpu-exporter" option ] [ "services" "vllm-xpu-exporter" option ])
    formerOptions;

  options.services.vllm-xpu-exporter = {
    enable = mkEnableOption "vllm-xpu-exporter, the Prometheus exporter for Intel GPUs shared by vLLM systemd units, containers and pods";

    package = mkOption {
      type = types.package;
      default = pkgs.callPackage ./package.nix { };
      defaultText = lib.literalExpression "pkgs.callPackage ./nix/package.nix { }";
      description = "The vllm-xpu-exporter package to run.";
    };

    port = mkOption {
      type = types.port;
      default = 10447;
      description = "TCP port to serve /metrics on.";
    };

    listenAddress = mkOption {
      type = types.str;
      default = "";
      example = "127.0.0.1";
      description = ''
        Address to listen on; empty for all interfaces (IPv6 and IPv4). An IPv6 address is given
        without brackets, e.g. `::1`.
      '';
    };

    units = mkOption {
      type = types.nonEmptyListOf types.str;
      default = [ "vllm*.service" ];
      example = [ "vllm-*.service" "llm@*.service" ];
      description = "Shell globs of the systemd units whose vLLM engine logs are read from the journal.";
    };

    webConfigFile = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "/etc/vllm-xpu-exporter/web.yml";
      description = ''
        exporter-toolkit web configuration (TLS, basic auth). A path as a string, outside the Nix store:
        the store is world-readable, and private keys and password hashes have no place there. The
        service reads it (and the files it names) with CAP_DAC_READ_SEARCH, whatever their owner.
      '';
    };

    extraFlags = mkOption {
      type = types.listOf types.str;
      default = [ ];
      example = [ "--log.level=debug" "--journal.boot=all" ];
      description = "Further command line flags (`vllm-xpu-exporter --help`).";
    };

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = "Open `port` in the firewall.";
    };

    socketActivation = {
      enable = mkOption {
        type = types.bool;
        default = false;
        description = ''
          Socket activation, as the packaged `vllm-xpu-exporter.socket`: a `vllm-xpu-exporter.socket` unit holds
          the listening sockets (`listenStreams`) from early boot, and the service serves the sockets it is
          handed (`--web.systemd-socket`) instead of binding `listenAddress` and `port` itself. A restart of the
          exporter refuses no scrape: systemd keeps accepting meanwhile.
        '';
      };

      listenStreams = mkOption {
        type = types.listOf types.str;
        default = [ ];
        example = [ "127.0.0.1:10447" "[::1]:10447" ];
        description = ''
          The socket's `ListenStream=` values, one listening socket each (systemd.socket(5): `PORT`,
          `ADDRESS:PORT`, `[IPv6]:PORT`); empty: the one of `listenAddress` and `port`. `openFirewall` opens
          `port` only.
        '';
      };
    };

    user = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "vllm-xpu-exporter";
      description = ''
        Run as this existing user instead of a transient one allocated at each start
        (`DynamicUser=yes`, the default).
      '';
    };

    plan = mkOption {
      type = types.attrsOf types.attrs;
      default = { };
      example = lib.literalExpression "import /etc/nixos/vllm-xpu-plan.nix";
      description = ''
        The values of `vllm-xpu-plan --format nixos`: per unit (NixOS service name), its `kvCacheMemoryBytes`
        and `gpuMemoryUtilization`. Give them to the units' own module (which writes their commands); here each
        unit's budget goes to `/etc/vllm-xpu-plan/UNIT.service.d/zz-vllm-xpu-plan.conf` (root's, mode 0444),
        named as the planner's systemd drop-in names it, and the exporter reads it from there
        (`--collector.processes.plans`): `xpu_unit_kv_cache_plan_bytes`, and `XpuUnitPlanNotApplied` when a
        unit's latest start ran without that budget.
      '';
    };

    gate = {
      units = mkOption {
        type = types.listOf types.str;
        default = [ ];
        example = [ "vllm-chat" "vllm-embedding.service" ];
        description = ''
          vLLM units (NixOS service names, `.service` optional) whose engine starts only when no other
          watched unit (`units`) on its GPU is initialising and enough memory is free: the init gate
          `vllm-xpu-gate wait` is added as their last `ExecStartPre=`, run as the unit's own user, and the gate
          service (`vllm-xpu-gate.socket`, `vllm-xpu-gate.service`) is installed (docs/gate.md). Works without
          `enable`.
        '';
      };

      timeoutSec = mkOption {
        type = types.ints.positive;
        default = 600;
        description = "Seconds a gated start waits for its turn at most (the client's --timeout).";
      };

      onTimeout = mkOption {
        type = types.enum [ "start" "fail" ];
        default = "start";
        description = "After timeoutSec: start the unit anyway, or fail its start.";
      };

      startTimeoutSec = mkOption {
        type = types.ints.positive;
        default = 90;
        description = ''
          The unit's own start time; a gated unit's `TimeoutStartSec=` is `timeoutSec + serviceTimeoutSec +
          startTimeoutSec` (a default: a unit's own `TimeoutStartSec=` wins).
        '';
      };

      extraFlags = mkOption {
        type = types.listOf types.str;
        default = [ ];
        example = [ "--device=0000:03:00.0" "--gpu-memory-utilization=0.75" ];
        description = "Further flags of every gated unit's client (`vllm-xpu-gate wait --help`).";
      };

      serviceTimeoutSec = mkOption {
        type = types.ints.positive;
        default = 30;
        description = ''
          Seconds a client waits for a gate service that does not answer before it starts its unit
          ungated, with one line (the client's --service-timeout).
        '';
      };

      serviceExtraFlags = mkOption {
        type = types.listOf types.str;
        default = [ ];
        example = [ "--lease-timeout=15m" ];
        description = "Further flags of the gate service (`vllm-xpu-gate serve --help`); `units` are its --journal.units.";
      };
    };
  };

  config = mkIf (cfg.enable || cfg.gate.units != [ ]) {
    networking.firewall.allowedTCPPorts = optionals (cfg.enable && cfg.openFirewall) [ cfg.port ];
    environment.etc = optionalAttrs cfg.enable planFiles;

    systemd.sockets = optionalAttrs (cfg.gate.units != [ ]) { vllm-xpu-gate = gateSocket; }
      // optionalAttrs (cfg.enable && socketActivated) { vllm-xpu-exporter = exporterSocket; };
    systemd.services = gatedServices // optionalAttrs (cfg.gate.units != [ ]) { vllm-xpu-gate = gateService; }
      // optionalAttrs cfg.enable {
      vllm-xpu-exporter = {
        description = "Prometheus exporter for Intel GPUs shared by vLLM units (vllm-xpu-exporter)";
        documentation = exporterDocumentation;
        wantedBy = [ "multi-user.target" ];
        after = [ "network.target" "systemd-udevd.service" ] ++ optionals socketActivated [ "vllm-xpu-exporter.socket" ];
        # as packaging/vllm-xpu-exporter-socket.conf: the service takes the socket's listening sockets
        requires = optionals socketActivated [ "vllm-xpu-exporter.socket" ];

        serviceConfig = hardening // {
          Type = "exec";
          ExecStart = utils.escapeSystemdExecArgs ([ "${cfg.package}/bin/vllm-xpu-exporter" ] ++ flags);
          ExecReload = "${pkgs.coreutils}/bin/kill -HUP $MAINPID";
          Restart = "on-failure";
          RestartSec = "5s";
          RestartPreventExitStatus = 2;
          RestrictAddressFamilies = [ "AF_UNIX" "AF_INET" "AF_INET6" "AF_NETLINK" ];
          MemoryMax = "512M";
          TasksMax = 64;
        } // (if cfg.user == null then { DynamicUser = true; } else { User = cfg.user; });
      };
    };
  };
}
