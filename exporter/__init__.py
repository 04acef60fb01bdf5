"""vllm-xpu-exporter: Prometheus exporter for Intel GPUs shared by vLLM systemd units, containers and pods."""

__version__ = "0.3.0"
