"""Folds: between a grammar and the collectors.

A fold reduces a source's entries, as its grammar parses them, into the state the collectors read;
it knows neither how the entries are read nor how its state becomes metrics.

- ``engine_starts``: the journal entries of watched units (their vLLM lines, parsed by
  ``vllm_xpu_exporter.parsers.vllm``, the init gate's lines, parsed by ``vllm_xpu_exporter.parsers.gate``, and PID 1's
  records about them) into each unit's engine starts, failures by reason, overlaps, KV-cache figures,
  gate decisions, and which units are initialising now (the gate ``vllm_xpu_exporter.gate`` reads that). The journal follower
  (``vllm_xpu_exporter.sources.logs.follower``) feeds it; the journal and processes collectors read it.
  Its parts: ``start`` (one start: what its lines said, the table from a vLLM event to its fields, and the
  KV-cache figures worked out from them) and ``init_windows`` (which inits run at once: overlaps and
  possible inits).
- ``container_runs``: which run of a container each of its log lines belongs to.
"""
