#!/bin/sh
# Three vLLM engines on one Intel GPU as Podman containers, each started through the init gate (docs/gate.md,
# "Containers") with the budget vllm-xpu-plan gave it (docs/planner.md): the same as compose.gated.yaml, for
# Podman. On the host: the gate service's socket (vllm-xpu-gate.socket, /run/vllm-xpu-gate) and the project's
# package, whose stdlib-only client runs in each container before vLLM. Run as root (rootful Podman):
#
#   export VLLM_XPU_GATE_CLIENT=$(/opt/vllm-xpu-exporter/bin/python3 -c \
#       'import os, vllm_xpu_exporter; print(os.path.dirname(vllm_xpu_exporter.__file__))')
#   sh podman.gated.sh    # all three at once: the gate lets one init run at a time
#
# The gate service watches them with `--journal.containers 'podman/vllm-*'` in /etc/default/vllm-xpu-gate
# (Podman's journald log driver, its default under systemd; with `--log-driver k8s-file`, add
# `--logs.podman`). Each R and budget below is the plan for the seed host's 16 GiB GPU: replace them with
# what `vllm-xpu-plan --format podman` prints for yours. The label and the annotation carry the budget for
# "Is the plan applied?" (Podman records the annotation where the exporter reads it). PODMAN: another podman
# command (its global options, e.g. `podman --root ...`).
set -eu

: "${VLLM_XPU_GATE_CLIENT:?set VLLM_XPU_GATE_CLIENT to the installed vllm_xpu_exporter package directory}"
PODMAN=${PODMAN:-podman}
IMAGE=vllm/vllm-openai-xpu:v0.24.0
PLAN_LABEL=io.vllm-xpu.plan.kv-cache-memory-bytes

# gated NAME R BUDGET COMMAND...: the container NAME running COMMAND with R and BUDGET, through the gate
gated() {
    name=$1 share=$2 budget=$3
    shift 3
    $PODMAN run -d --replace --name "$name" --device /dev/dri \
        -v /run/vllm-xpu-gate:/run/vllm-xpu-gate \
        -v "$VLLM_XPU_GATE_CLIENT:/vllm-xpu-gate/vllm_xpu_exporter:ro" \
        --label "$PLAN_LABEL=$budget" --annotation "$PLAN_LABEL=$budget" \
        --entrypoint "[\"python3\", \"/vllm-xpu-gate/vllm_xpu_exporter/gate/container_wait.py\", \"--gpu-memory-utilization\", \"$share\", \"--timeout\", \"10m\", \"--\"]" \
        "$IMAGE" "$@" --gpu-memory-utilization "$share" --kv-cache-memory-bytes "$budget"
}

gated vllm-chat 0.7507 3495028740 vllm serve google/gemma-3-4b-it --max-model-len 131072 --max-num-seqs 3
gated vllm-embedding 0.0707 660351210 vllm serve BAAI/bge-small-en-v1.5 --max-model-len 512
gated vllm-stt 0.0707 413390562 vllm serve openai/whisper-small --max-model-len 448
