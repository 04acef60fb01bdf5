"""vllm-xpu-exporter: Prometheus exporter for Intel GPUs shared by vLLM systemd units."""

__version__ = "0.3.0"
