"""The bounds of figures read from a unit's output (the vLLM grammar's, and the gate's lines'), in a module
of their own so that the gate's client imports them without the vLLM grammar."""

# 1 PiB: far above the memory of any device or host vLLM runs on, far below where float rounding
# of a byte count starts (2**53).
MAX_BYTES = 1 << 50
# Context lengths reach ~10M tokens (2**24) and a KV cache a few 10**9 tokens.
MAX_TOKENS = 1 << 40
# An engine init (model download, load, compilation) takes minutes, hours at worst.
MAX_SECONDS = 7 * 24 * 3600
