"""vllm-xpu-plan, the planner (docs/planner.md): `cli.py` its command line (reading the journal, Level Zero or
Prometheus, printing or writing the plan); `plans.py` the plan of each unit on its GPU, `rightsizing.py` a KV
budget from the observed load, `execstart.py` a unit's ExecStart= and the plan's edit of it and `containers.py`
the plan in the forms container runtimes take (a Compose override, Podman command lines), all pure (the
exporter's processes collector plans with `plans.py` too, through `vllm_xpu_exporter.attribution`)."""
