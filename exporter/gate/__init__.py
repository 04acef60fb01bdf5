"""`vllm-xpu-gate`: the init gate of vLLM units (docs/gate.md). A vLLM unit's engine starts only when no
other watched unit on its GPU is initialising and enough device memory is free, or, when every unit
concerned runs with an absolute KV budget, as soon as the memory covers them all.

Two commands of one console script:

    vllm-xpu-gate serve   the service: its own unit (packaging/vllm-xpu-gate.service), socket-activated
    vllm-xpu-gate wait    the client: a vLLM unit's last ExecStartPre=, as the unit's own user

The service follows the journal once through the same follower and fold as the exporter
(`LogFollower` over `vllm_xpu_exporter.fold.engine_starts`), reads Level Zero in a child
(`LevelZeroWorker`), and answers the clients on a Unix socket; it knows the caller's unit from the
kernel (SO_PEERCRED, then the caller's cgroup), never from the client.

The modules, by concern:

- `service`: the socket, who asks, the leases in memory, the one thread that decides;
- `client`: asks for a turn, writes the service's lines, starts its unit ungated when no service answers;
- `protocol`: what the two say to each other over the socket;
- `decision`: `decide`, the pure decision for a unit on a device (in order, or by the plan), and
  `lease_over`, when a release stops holding others back;
- `cli`: the commands and their flags, `main` (the console script; also `python -m vllm_xpu_exporter.gate`).

The lines the client writes (the gate's decisions) are a grammar of their own, `vllm_xpu_exporter.parsers.gate`,
which the journal fold reads without importing this package. Nothing is imported here.
"""
