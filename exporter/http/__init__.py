"""The exporter's HTTP layer:

- `connections`: `ConnectionServer`, HTTP/1.1 connections (one event-loop thread reads requests, a fixed pool
  of workers answers complete ones; bounded heads, times and connections);
- `server`: `ExporterServer`, the routes (metrics, landing page, health), basic auth, TLS and gzip on it;
- `exposition`: /metrics in the text format and OpenMetrics, prometheus_client's bytes, sooner;
- the web config (`--web.config.file`, exporter-toolkit's format): `webconfig` (the config as loaded and
  its checks of a request), `loading` (reading and validating the file), `tls` (its TLS context),
  `reloading` (following the file, SIGHUP).
"""
