"""The bundled collectors, one module per source family; importing this package registers them
(`exporter.collector.register`) in the order of their `--collector.NAME` flags."""

from exporter.collectors import levelzero, processes, journal  # noqa: F401
