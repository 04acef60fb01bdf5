"""`vllm-xpu-gate`: an `ExecStartPre=` gate that lets a vLLM unit's engine start only when no other watched
unit on the same GPU is initialising and enough device memory is free, and otherwise waits.

    ExecStartPre=+/bin/busybox env -i /opt/vllm-xpu-exporter/bin/vllm-xpu-gate --unit %n --timeout 10m

(a static `env -i` first: the gate runs as root, and the unit's environment is its user's; docs/security.md).

It reads the same journal through the same fold as the exporter (`JournalFollower` over
`vllm_xpu_exporter.fold.engine_starts`) to know which watched units are initialising (main process started, init
neither completed nor failed; a unit waiting in its own gate is not), and Level Zero, in a child
(`LevelZeroWorker`), for free and total memory. It needs no running exporter.

Decision, per device: release (exit 0) once no other watched unit on the device is initialising, no other
unit holds the device's lease, and free memory is at least ceil(R x total), R from
--gpu-memory-utilization or what the unit's latest start printed (unknown R: only inits are waited for).
Two gates never release together: each decides holding an flock on `<lease dir>/<device>.lock`, and a
release writes `<lease dir>/<device>.lease` naming the unit and its invocation id (systemd's, from
`systemctl show`; $INVOCATION_ID only when systemctl cannot answer). The lease holds from release until that invocation's init
completes or fails in the journal, the unit's process is gone (the journal or systemctl says so), or the
lease times out (--lease-timeout); a stale lease never blocks anyone, and a unit's own lease never blocks
it. On hosts with several GPUs a unit counts on the devices its processes hold DRM clients on (procfs) or
its lease names; a unit whose device is unknown counts on every device.

A gate that cannot read the journal or Level Zero, or whose device reports untrusted memory accounting,
says so and releases at once: it never strands a unit. After --timeout it exits 0 with a warning
(--on-timeout start, the default) or 1 (fail). Bad flags exit 2 with one line. Every line it writes
(stderr: the unit's journal) begins with "vllm-xpu-gate: "; the decision lines are written and read by
`vllm_xpu_exporter.gate.lines`.

The modules, by concern:

- `lines`: the lines the gate writes, which the journal fold (`vllm_xpu_exporter.fold.engine_starts`) reads back;
- `decision`: `decide`, the pure decision for a unit on a device;
- `leases`: the lease directory: the per-device lock and lease files, and when a lease ends;
- `systemctl`: what the gate asks systemd (a unit's TimeoutStartSec=, invocation id, whether it is gone);
- `cli`: the flags, `Gate` (the loop that reads the sources, decides, grants the lease, releases or
  times out) and `main`, the console script's entry point (also `python -m vllm_xpu_exporter.gate`).

Nothing is imported here: the fold imports `lines` and must not pull in the gate's program.
"""
