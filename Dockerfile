# syntax=docker/dockerfile:1
# xpu-exporter: build a wheel, then install it on a slim runtime with the Level Zero loader and
# Intel's GPU user-space driver. See README.md ("Container") for the `docker run` line.

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
# libze1: the Level Zero loader; intel-opencl-icd ships Intel's Level Zero GPU driver (libze_intel_gpu.so.1).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libze1=1.8.12-1 intel-opencl-icd=22.43.24595.41-1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --system --uid 10447 --no-create-home --shell /usr/sbin/nologin xpu-exporter
USER 10447
EXPOSE 10447
ENTRYPOINT ["xpu-exporter"]
