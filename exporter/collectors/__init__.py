"""The bundled collectors, one module per source family; importing this package (the command line,
`vllm_xpu_exporter.cli`, does; `vllm_xpu_exporter.collector` never does) registers them (`vllm_xpu_exporter.collector.register`) in
the order of their `--collector.NAME` flags, which is the order a scrape runs them in: the Level Zero
child answers the request sent at the scrape's start while the journal and processes collectors read
their sources, so the levelzero collector comes last."""

from vllm_xpu_exporter.collectors import journal, processes, levelzero  # noqa: F401
