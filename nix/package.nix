# vllm-xpu-exporter built from this repository: `pkgs.callPackage ./nix/package.nix { }`.
#
# Level Zero and sd-journal are loaded at run time (ctypes), so the wrapper puts the loader, libsystemd
# and NixOS's driver directory (/run/opengl-driver/lib, where `hardware.graphics.extraPackages =
# [ pkgs.intel-compute-runtime ]` puts libze_intel_gpu.so.1) on LD_LIBRARY_PATH.
{ lib, python3Packages, level-zero, systemd }:

python3Packages.buildPythonApplication {
  pname = "vllm-xpu-exporter";
  version = builtins.head (builtins.match ''.*__version__ = "([^"]+)".*'' (builtins.readFile ../exporter/__init__.py));
  pyproject = true;

  src = lib.cleanSource ../.;

  build-system = [ python3Packages.setuptools ];
  dependencies = [
    python3Packages.prometheus-client
    python3Packages.pyudev
    python3Packages.pyyaml
    python3Packages.bcrypt
  ];

  makeWrapperArgs = [
    "--prefix" "LD_LIBRARY_PATH" ":" "${lib.makeLibraryPath [ level-zero systemd ]}:/run/opengl-driver/lib"
  ];

  # The test suite needs Debian's tools (systemd-journal-remote, promtool, ...); it runs in the project's CI.
  doCheck = false;

  meta = {
    description = "Prometheus exporter for Intel GPUs shared by vLLM systemd units, containers and pods";
    license = lib.licenses.asl20;
    mainProgram = "vllm-xpu-exporter";
    platforms = lib.platforms.linux;
  };
}
