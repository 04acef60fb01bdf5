"""What the two sources of engines' log lines share, below both: the systemd journal
(``vllm_xpu_exporter.sources.journal``) and the containers' log files (``vllm_xpu_exporter.sources.containerlogs``).

- ``entry``: ``LogEntry``, one line of a watched unit or container (or systemd's record about it), and
  ``LogSelection``, which units and containers are watched and from which boot;
- ``follower``: ``LogFollower``, the thread that catches up with one such source, then follows it, folding its
  entries into engine starts (``vllm_xpu_exporter.fold.engine_starts``) and publishing them as ``LogState``.

Neither source imports the other; both import these.
"""
