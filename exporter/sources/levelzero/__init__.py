"""Level Zero (oneAPI Sysman) as a source, in two layers:

- ``binding``: the ctypes binding of the Level Zero loader's Sysman API (``LevelZero``, ``Device``, the
  readings' dataclasses, ``LevelZeroError``); standard library only, cheap to import;
- a child process that makes every Level Zero call, so that a crashing or hanging driver costs a read, never
  the exporter: ``child`` (the process), ``wire`` (what it and the exporter say), ``worker``
  (``LevelZeroWorker``, the exporter's handle on it), and ``telemetry`` (the telemetry kinds, one row each,
  which the child reads and the levelzero collector serves).

Nothing is imported here: the child (``python -m vllm_xpu_exporter.sources.levelzero.child``) loads this package
first, and needs only the binding, the telemetry rows and the wire.
"""
