# syntax=docker/dockerfile:1
# vllm-xpu-exporter container image. docs/deployment.md ("Container") has the `docker run` line and why
# each of its options is there.
#
# Base: Debian 13 (trixie) with Python 3.12. Trixie ships the Level Zero loader (libze1 1.20) but no
# Intel GPU driver at all: intel-compute-runtime, which provides libze_intel_gpu.so.1, is in Debian 12
# (22.43, end of 2022: no xe kernel driver, so no Battlemage) and again in Debian 14 "forky"
# (testing, 26.x), not in 13. The GPU user space (loader, driver, its gmmlib) therefore comes from
# forky, pinned at priority 100 so that nothing else does; everything else is trixie's.
# Exact versions, so that two builds a month apart get the same driver: forky's as of 2026-12-04. Testing
# drops a version once a newer one migrates; apt then fails the build ("version not found") rather than
# take another: pass the current ones with --build-arg (docs/deployment.md says how to find them).

ARG PYTHON_IMAGE=python:3.12-slim-trixie

# The commit and the repository the image is built from (docs/deployment.md: `--build-arg REVISION=$(git
# rev-parse HEAD) --build-arg SOURCE=...`): the OCI labels below, and REVISION the revision label of
# xpu_exporter_build_info (the file exporter/REVISION, installed with the package).
ARG REVISION=unknown
ARG SOURCE=unknown

FROM ${PYTHON_IMAGE} AS build
ARG REVISION
WORKDIR /src
COPY pyproject.toml README.md LICENSE CHANGELOG.md SECURITY.md ./
COPY exporter ./exporter
# exporter/http/runbook.md links to docs/runbook.md (the runbook the exporter serves at /runbook), and the package
# installs the documentation under /opt/vllm-xpu-exporter/share/doc/vllm-xpu-exporter/
COPY docs ./docs
RUN printf '%s\n' "${REVISION}" > exporter/REVISION \
    && python -m venv /opt/vllm-xpu-exporter \
    && /opt/vllm-xpu-exporter/bin/pip install --no-cache-dir . \
    && /opt/vllm-xpu-exporter/bin/pip uninstall --yes pip

FROM ${PYTHON_IMAGE}
# compute-runtime 25 and later: xe kernel driver on by default (since 24.13), Arc (Alchemist, i915 or
# xe), Battlemage (xe), Lunar Lake, Data Center GPU Flex/Max.
ARG COMPUTE_RUNTIME_VERSION=26.27.39122.14-1
ARG LEVEL_ZERO_VERSION=1.32.0-1
ARG GMMLIB_VERSION=22.10.2+ds1-1
ARG LIBCAP_VERSION=1:2.75-10+deb13u1+b3
# The OCI annotations (image-spec's annotations.md): what the image is, which release and commit, from which
# repository and base.
ARG PYTHON_IMAGE
ARG REVISION
ARG SOURCE
LABEL org.opencontainers.image.title="vllm-xpu-exporter" \
      org.opencontainers.image.description="Prometheus exporter for Intel GPUs shared by vLLM systemd units, containers and pods" \
      org.opencontainers.image.version="0.3.0" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# forky's source is trixie's main source with the suite replaced.
RUN sed -n '1,/^$/p' /etc/apt/sources.list.d/debian.sources \
        | sed 's/^Suites:.*/Suites: forky/' > /etc/apt/sources.list.d/forky.sources \
    && printf 'Package: *\nPin: release n=forky\nPin-Priority: 100\n' > /etc/apt/preferences.d/forky \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
        "libze-intel-gpu1=${COMPUTE_RUNTIME_VERSION}" \
        "libze1=${LEVEL_ZERO_VERSION}" \
        "libigdgmm12=${GMMLIB_VERSION}" \
        "libcap2-bin=${LIBCAP_VERSION}" \
    && rm -rf /var/lib/apt/lists/*

COPY --from=build /opt/vllm-xpu-exporter /opt/vllm-xpu-exporter
COPY --chmod=0755 packaging/container-entrypoint /opt/vllm-xpu-exporter/bin/container-entrypoint
# raise-caps: see packaging/container-entrypoint. No set-user-ID programs are left in the image, so
# raise-caps is the only way to any privilege, and it is bounded by the container's --cap-add.
RUN install -d /opt/vllm-xpu-exporter/libexec \
    && install -m 0755 /usr/bin/setpriv /opt/vllm-xpu-exporter/libexec/raise-caps \
    && setcap cap_perfmon,cap_sys_ptrace,cap_dac_read_search=p /opt/vllm-xpu-exporter/libexec/raise-caps \
    && find / -xdev -type f -perm /6000 -exec chmod a-s {} + \
    && groupadd --system --gid 10447 vllm-xpu-exporter \
    && useradd --system --uid 10447 --gid 10447 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin vllm-xpu-exporter \
    && /opt/vllm-xpu-exporter/bin/python -c 'import ctypes; [ctypes.CDLL(name) for name in ("libze_loader.so.1", "libze_intel_gpu.so.1", "libsystemd.so.0", "libudev.so.1")]' \
    && /opt/vllm-xpu-exporter/bin/vllm-xpu-exporter --version

ENV PATH=/opt/vllm-xpu-exporter/bin:$PATH
USER 10447:10447
EXPOSE 10447
ENTRYPOINT ["/opt/vllm-xpu-exporter/bin/container-entrypoint"]
