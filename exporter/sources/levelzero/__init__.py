"""Level Zero (oneAPI Sysman) as a source, in two layers:

- ``binding``: the ctypes binding of the Level Zero loader's Sysman API (``LevelZero``, ``Device``, the
  readings' dataclasses, ``LevelZeroError``); standard library only, cheap to import;
- ``worker``: ``LevelZeroWorker``, the child process that makes every Level Zero call, so that a crashing
  or hanging driver costs a read, never the exporter, and its wire format.

Nothing is imported here: the child (``python -m vllm_xpu_exporter.sources.levelzero.worker``) loads this package
first, and needs only the binding.
"""
