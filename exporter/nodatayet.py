"""No data yet: a source still starting (the journal's first read, Level Zero's init) has nothing to say,
a state every start goes through, not a failure.

A source raises ``NoDataYet`` (or an error of its own that is also one, as Level Zero's ``LevelZeroStarting``),
or publishes one as its state's error (``LogState.error``). Its consumers tell it from a failure with
``isinstance``, never by its text, which is for people: the scrape logs it at info, the gate and the planner
wait for the source.
"""


class NoDataYet(Exception):
    """A source has no data yet; the message says which and why ("still reading the journal")."""
