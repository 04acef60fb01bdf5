"""The gate's client in a container, before its engine (docs/gate.md, "Containers"): the same request and
answers as `vllm-xpu-gate wait` (`vllm_xpu_exporter.gate.client`, over `vllm_xpu_exporter.gate.protocol`), then,
released, the engine's command in its place (exec: the same process, so the container's cgroup has its
engine and nothing else once the gate's answer is in).

    python3 /vllm-xpu-gate/vllm_xpu_exporter/gate/container_wait.py [wait flags] -- vllm serve ...

It needs nothing installed in the engine's image but a python3: the project's package directory is bound
into the container read-only (here at /vllm-xpu-gate/vllm_xpu_exporter), and what the client loads of it is
the standard library's and the package's client modules, which import nothing else (no source, no native
library). The wait's flags are `vllm-xpu-gate wait`'s; the planner's variables are read as it reads them.

Exit: the engine's, once released; 1 when the wait ran out with --on-timeout fail; 143 when the container is
stopped while it waits (the engine is not started); 2 for bad flags; 127 when the command cannot be run.
"""

from __future__ import annotations

import os
import signal
import sys

if not __package__:  # run as a file: the package is the directory above this one's parent
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXIT_TERMINATED = 128 + signal.SIGTERM
EXIT_CANNOT_RUN = 127


def main(argv: list[str] | None = None) -> int:
    from vllm_xpu_exporter.argparsing import EXIT_USAGE
    from vllm_xpu_exporter.gate.cli import parse_client_options
    from vllm_xpu_exporter.gate.client import run_client
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        sys.stderr.write("vllm-xpu-gate: error: want the engine's command after `--` (container_wait.py "
                         "[wait flags] -- vllm serve ...)\n")
        return EXIT_USAGE
    split = argv.index("--")
    flags, command = argv[:split], argv[split + 1:]
    status = run_client(parse_client_options(flags), terminated_status=EXIT_TERMINATED)
    if status != 0:
        return status
    for number in (signal.SIGTERM, signal.SIGHUP):  # the engine handles its signals as it would without the gate
        signal.signal(number, signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as error:
        sys.stderr.write(f"vllm-xpu-gate: error: cannot run {command[0]}: {error.strerror or error}\n")
    return EXIT_CANNOT_RUN


if __name__ == "__main__":
    sys.exit(main())
