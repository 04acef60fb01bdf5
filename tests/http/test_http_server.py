import errno
import gzip
import http.client
import logging
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import choose_encoder as choose_client_encoder
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.registry import Collector

from vllm_xpu_exporter.families import CounterFamily, GaugeFamily
from vllm_xpu_exporter.http.connections import ServerLimits
from vllm_xpu_exporter.http.server import ExporterServer, parse_listen_address
from vllm_xpu_exporter.http.loading import load_web_config
from vllm_xpu_exporter.http.webconfig import WebConfig
from certs import CLIENT_SAN, Pki
from httpclient import basic, client_context, curl, request
from polling import wait_for
from webconfigs import basic_auth_users, tls_server_config, write_web_config

OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
PASSWORD = "s3cret-scrape"
PASSWORD_HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()


class SampleCollector(Collector):
    def collect(self):
        gauge = GaugeMetricFamily("sample_memory_bytes", "Sample gauge.", labels=["device"])
        gauge.add_metric(["0000:03:00.0"], 1024.0)
        yield gauge
        counter = CounterMetricFamily("sample_events", "Sample counter.")
        counter.add_metric([], 7.0)
        yield counter


class FailingCollector(Collector):
    def collect(self):
        raise RuntimeError("driver exploded at /secret/path")


def sample_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SampleCollector())
    return registry


@contextmanager
def running(listen: str = "127.0.0.1:0", telemetry_path: str = "/metrics",
            registry: CollectorRegistry | None = None, web_config: WebConfig | None = None,
            limits: ServerLimits | None = None) -> Iterator[ExporterServer]:
    server = ExporterServer(listen, telemetry_path, registry or sample_registry(), web_config, limits=limits)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join(5)
        assert not thread.is_alive()


def fetch(server: ExporterServer, path: str = "/metrics", method: str = "GET",
          headers: Mapping[str, str] | None = None, host: str | None = None,
          context: ssl.SSLContext | None = None, body: bytes | None = None,
          timeout: float = 10) -> tuple[int, http.client.HTTPMessage, bytes]:
    address = host or server.server_addresses[0][0]
    if address == "::":
        address = "::1"
    return request(address, server.server_addresses[0][1], path, method=method, headers=headers, context=context,
                   body=body, timeout=timeout)



@pytest.fixture(scope="module")
def server() -> Iterator[ExporterServer]:
    with running() as plain_server:
        yield plain_server


# --------------------------------------------------------------------------------------- listen address

@pytest.mark.parametrize("value, expected", [
    (":9999", ("", 9999)),
    (":0", ("", 0)),
    ("0.0.0.0:9999", ("0.0.0.0", 9999)),
    ("127.0.0.1:9999", ("127.0.0.1", 9999)),
    ("[::1]:9999", ("::1", 9999)),
    ("[::]:9999", ("::", 9999)),
    ("localhost:9999", ("localhost", 9999)),
    ("exporter-1.example.org:65535", ("exporter-1.example.org", 65535)),
])
def test_listen_address_accepts_the_go_forms(value, expected):
    assert parse_listen_address(value) == expected


@pytest.mark.parametrize("value", [
    "", "9999", ":", ":65536", ":99999", ":-1", ":http", ": 9999", "::1:9999", "[::1]", "[::1", "[::1:9999", "[::1]9999", "[::1]:", "[]:9999",
    "[localhost]:9999", "256.1.1.1:9999", "1.2.3:9999", "exa mple:9999", "http://localhost:9999", "host_name:80",
    "0x7f.1:9999", "0x7f:9999", "0x7f000001:9999", "127.1:9999", "2130706433:9999", "0177.0.0.1:9999",
    "127.0.0.1.:9999", "example.123:9999",
])
def test_listen_address_rejects_malformed_values_with_one_line(value):
    with pytest.raises(ValueError) as caught:
        parse_listen_address(value)
    assert "\n" not in str(caught.value)
    assert "invalid listen address" in str(caught.value)


def test_server_rejects_a_telemetry_path_without_leading_slash():
    with pytest.raises(ValueError, match="must start with '/'"):
        ExporterServer("127.0.0.1:0", "metrics", sample_registry())


def test_port_in_use_raises_oserror(server):
    with pytest.raises(OSError) as caught:
        ExporterServer(f"127.0.0.1:{server.server_addresses[0][1]}", "/metrics", sample_registry())
    assert caught.value.errno == errno.EADDRINUSE


def test_address_not_on_this_host_raises_oserror():
    with pytest.raises(OSError) as caught:
        ExporterServer("192.0.2.1:0", "/metrics", sample_registry())  # TEST-NET-1, never local
    assert caught.value.errno == errno.EADDRNOTAVAIL


# ------------------------------------------------------------------------------------------- endpoints

def test_default_scrape_gets_text_format_0_0_4(server):
    status, headers, body = fetch(server)
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {family.name: family for family in parse_text(body.decode())}
    assert families["sample_memory_bytes"].samples[0].labels == {"device": "0000:03:00.0"}
    assert families["sample_memory_bytes"].samples[0].value == 1024.0
    assert families["sample_events"].samples[0].value == 7.0


def test_openmetrics_scrape_gets_openmetrics(server):
    status, headers, body = fetch(server, headers={"Accept": OPENMETRICS_ACCEPT})
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")
    families = {family.name: family for family in parse_openmetrics(body.decode())}
    assert families["sample_events"].type == "counter"


def test_gzip_is_used_when_the_client_accepts_it(server):
    status, headers, body = fetch(server, headers={"Accept-Encoding": "gzip, deflate"})
    assert status == 200
    assert headers["Content-Encoding"] == "gzip"
    assert b"sample_memory_bytes" in gzip.decompress(body)
    _, plain_headers, plain_body = fetch(server)
    assert plain_headers["Content-Encoding"] is None
    assert plain_body == gzip.decompress(body)


@pytest.mark.parametrize("accept_encoding", ["gzip;q=0", "gzip; q=0.000", "deflate, gzip;q=0", "identity", "*"])
def test_gzip_is_not_used_when_the_client_refuses_or_does_not_name_it(server, accept_encoding):
    status, headers, body = fetch(server, headers={"Accept-Encoding": accept_encoding})
    assert status == 200
    assert headers["Content-Encoding"] is None
    assert b"sample_memory_bytes" in body


@pytest.mark.parametrize("accept_encoding", ["gzip;q=0.5", "x-gzip", "br;q=1.0, GZIP;Q=0.1"])
def test_gzip_is_used_at_any_q_value_above_zero(server, accept_encoding):
    _, headers, body = fetch(server, headers={"Accept-Encoding": accept_encoding})
    assert headers["Content-Encoding"] == "gzip"
    assert b"sample_memory_bytes" in gzip.decompress(body)


def test_head_returns_the_headers_of_get_without_a_body(server):
    _, get_headers, get_body = fetch(server)
    status, headers, body = fetch(server, method="HEAD")
    assert status == 200
    assert body == b""
    assert headers["Content-Type"] == get_headers["Content-Type"]
    assert int(headers["Content-Length"]) == len(get_body)


class FilterCollector(Collector):
    """Families of every shape /metrics?name[]= restricts: the exporter's row families (vllm_xpu_exporter.families)
    and prometheus_client's, a counter with a _created sample and a histogram among them."""

    def collect(self):
        gauge = GaugeFamily("xpu_rows_bytes", "Row gauge.", labels=["device"])
        gauge.add_metric(["0000:03:00.0"], 1024)
        yield gauge
        yield CounterFamily("xpu_rows_events", "Row counter.", value=7)
        yield GaugeMetricFamily("client_gauge", "Client gauge.", value=3.5)
        yield CounterMetricFamily("client_events", "Client counter.", value=2.0, created=1_700_000_000.0)
        yield HistogramMetricFamily("client_seconds", "Client histogram.", buckets=[("1.0", 1.0), ("+Inf", 3.0)],
                                    sum_value=4.5)


def filter_registry() -> CollectorRegistry:
    # Described, so that prometheus_client's restricted_registry finds the collector by its names (the
    # exporter's restriction needs no names: vllm_xpu_exporter.http.exposition.restricted).
    registry = CollectorRegistry(auto_describe=True)
    registry.register(FilterCollector())
    return registry


@pytest.fixture(scope="module")
def filter_server() -> Iterator[ExporterServer]:
    with running(registry=filter_registry()) as filtering:
        yield filtering


def name_query(names: list[str]) -> str:
    return "/metrics?" + "&".join(f"name[]={name}" for name in names)


NAME_FILTERS = {
    "row-gauge": ["xpu_rows_bytes"],
    "row-counter-by-sample-name": ["xpu_rows_events_total"],
    "row-counter-by-family-name": ["xpu_rows_events"],
    "client-counter-total-only": ["client_events_total"],
    "client-counter-and-created": ["client_events_total", "client_events_created"],
    "histogram-by-family-name": ["client_seconds"],
    "histogram-parts": ["client_seconds_bucket", "client_seconds_count"],
    "several-and-unknown": ["client_gauge", "xpu_rows_bytes", "no_such_metric"],
    "unknown-only": ["no_such_metric"],
}


@pytest.mark.parametrize("names", NAME_FILTERS.values(), ids=NAME_FILTERS.keys())
@pytest.mark.parametrize("accept", ["", "text/plain;version=0.0.4", OPENMETRICS_ACCEPT],
                         ids=["none", "text", "openmetrics"])
def test_name_filter_serves_what_prometheus_clients_restricted_registry_serves(filter_server, names, accept):
    status, headers, body = fetch(filter_server, name_query(names), headers={"Accept": accept})
    encoder, content_type = choose_client_encoder(accept)
    assert (status, headers["Content-Type"]) == (200, content_type)
    assert body == encoder(filter_registry().restricted_registry(names))


def test_name_filter_keeps_the_samples_named_and_leaves_out_the_families_without_any(filter_server):
    _, _, body = fetch(filter_server, name_query(["xpu_rows_events_total", "client_seconds_count", "client_gauge",
                                                  "xpu_rows_events", "no_such_metric"]))
    families = {family.name: family for family in parse_text(body.decode())}
    assert set(families) == {"xpu_rows_events", "client_seconds", "client_gauge"}
    assert [sample.name for sample in families["client_seconds"].samples] == ["client_seconds_count"]
    assert families["xpu_rows_events"].samples[0].value == 7.0


def test_name_filter_with_openmetrics_and_gzip_is_the_filtered_body_compressed(filter_server):
    query = name_query(["client_events_total", "xpu_rows_bytes"])
    _, _, plain = fetch(filter_server, query, headers={"Accept": OPENMETRICS_ACCEPT})
    status, headers, body = fetch(filter_server, query,
                                  headers={"Accept": OPENMETRICS_ACCEPT, "Accept-Encoding": "gzip"})
    assert (status, headers["Content-Encoding"]) == (200, "gzip")
    assert gzip.decompress(body) == plain
    assert plain.endswith(b"# EOF\n")
    assert {family.name for family in parse_openmetrics(plain.decode())} == {"client_events", "xpu_rows_bytes"}


def test_name_filter_matching_nothing_serves_an_empty_exposition(filter_server):
    assert fetch(filter_server, name_query(["no_such_metric"]))[::2] == (200, b"")
    assert fetch(filter_server, name_query(["no_such_metric"]), headers={"Accept": OPENMETRICS_ACCEPT})[::2] == \
        (200, b"# EOF\n")


@pytest.mark.parametrize("query", ["name%5B%5D=client_gauge", "other=1&name[]=client_gauge&name[]=",
                                   "name[]=client%5Fgauge"])
def test_name_filter_is_read_as_parse_qs_reads_it(filter_server, query):
    _, _, body = fetch(filter_server, "/metrics?" + query)
    assert body == generate_latest(filter_registry().restricted_registry(["client_gauge"]))


@pytest.mark.parametrize("query", ["", "?name[]=", "?name=client_gauge", "?names[]=client_gauge"])
def test_without_a_name_filter_every_family_is_served(filter_server, query):
    assert fetch(filter_server, "/metrics" + query)[2] == generate_latest(filter_registry())


def test_head_with_a_name_filter_has_the_filtered_length(filter_server):
    query = name_query(["client_gauge"])
    _, _, body = fetch(filter_server, query)
    status, headers, head_body = fetch(filter_server, query, method="HEAD")
    assert (status, head_body, int(headers["Content-Length"])) == (200, b"", len(body))


def test_landing_page_links_to_the_telemetry_path():
    with running(telemetry_path="/custom-metrics") as custom:
        status, headers, body = fetch(custom, "/")
        assert status == 200
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert b'<a href="/custom-metrics">' in body
        assert b"<title>vllm-xpu-exporter</title>" in body
        assert fetch(custom, "/metrics")[0] == 404
        assert fetch(custom, "/custom-metrics")[0] == 200


def test_telemetry_path_at_root_serves_metrics_instead_of_the_landing_page():
    with running(telemetry_path="/") as root:
        status, headers, body = fetch(root, "/")
        assert status == 200
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert b"sample_memory_bytes" in body


@pytest.mark.parametrize("path", ["/-/healthy", "/-/ready"])
def test_health_and_readiness_endpoints_answer_ok(server, path):
    assert fetch(server, path)[::2] == (200, b"OK")


class BlockingCollector(Collector):
    """Holds every collection until `release` is set, counting those under way."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)

    def collect(self):
        self.started.release()
        self.release.wait(10)
        yield from SampleCollector().collect()


@pytest.mark.parametrize("max_requests, refused", [(1, 1), (2, 0), (0, 0)])
def test_metrics_requests_beyond_max_requests_get_503_while_the_others_are_served(max_requests, refused):
    blocking = BlockingCollector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(blocking)
    server = ExporterServer("127.0.0.1:0", "/metrics", registry, max_requests=max_requests)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(fetch, server)
            assert blocking.started.acquire(timeout=10)  # the first is being collected
            second = pool.submit(fetch, server)
            if refused:
                status, headers, body = second.result(10)
                assert (status, headers["Retry-After"]) == (503, "1")
                assert body == f"Limit of concurrent requests reached ({max_requests}), try again later.\n".encode()
                assert fetch(server, "/-/healthy")[0] == 200  # only metrics requests count
            else:
                assert blocking.started.acquire(timeout=10)  # the second is being collected too
            blocking.release.set()
            assert first.result(10)[0] == 200
            if not refused:
                assert second.result(10)[0] == 200
    finally:
        blocking.release.set()
        server.shutdown()
        thread.join(5)


@pytest.mark.parametrize("path", ["/nope", "/metrics/", "/favicon.ico"])
def test_unknown_paths_get_404(server, path):
    assert fetch(server, path)[0] == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "BREW"])
def test_other_methods_get_405_with_allow_header(server, method):
    status, headers, _ = fetch(server, method=method, body=b"payload")
    assert status == 405
    assert headers["Allow"] == "GET, HEAD"


def test_keep_alive_serves_several_requests_on_one_connection(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.server_addresses[0][1], timeout=5)
    try:
        for _ in range(3):
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            assert response.status == 200
            assert b"sample_events_total" in response.read()
    finally:
        connection.close()


def test_collection_error_returns_500_with_one_line_and_is_logged(caplog):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FailingCollector())
    with running(registry=registry) as failing, caplog.at_level(logging.ERROR, logger="vllm_xpu_exporter.web"):
        status, headers, body = fetch(failing)
        assert status == 500
        assert body == b"An error has occurred while collecting metrics.\n"
        assert b"Traceback" not in body and b"secret" not in body
        assert "driver exploded" in caplog.text
        assert fetch(failing, "/-/healthy")[0] == 200


def test_requests_are_not_logged_to_stderr_but_to_the_debug_logger(server, capfd, caplog):
    with caplog.at_level(logging.DEBUG, logger="vllm_xpu_exporter.web"):
        fetch(server, "/metrics?marker=1")
        fetch(server, "/nope")
        assert wait_for(lambda: '"GET /nope HTTP/1.1" 404' in caplog.text)
    assert '"GET /metrics?marker=1 HTTP/1.1" 200' in caplog.text
    assert all(record.levelno == logging.DEBUG for record in caplog.records if record.name == "vllm_xpu_exporter.web")
    assert capfd.readouterr().err == ""


# --------------------------------------------------------------------------------------- concurrency

def test_two_hundred_concurrent_scrapes_are_all_answered(server):
    start = threading.Barrier(200)

    def scrape(_: int) -> tuple[int, bytes]:
        start.wait(10)
        status, _headers, body = fetch(server, timeout=30)
        return status, body

    with ThreadPoolExecutor(max_workers=200) as pool:
        results = list(pool.map(scrape, range(200)))
    assert [status for status, _ in results] == [200] * 200
    assert len({body for _, body in results}) == 1


def test_a_slow_client_holding_a_half_sent_request_does_not_block_others(server):
    slow = socket.create_connection(("127.0.0.1", server.server_addresses[0][1]), timeout=10)
    silent = socket.create_connection(("127.0.0.1", server.server_addresses[0][1]), timeout=10)
    try:
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: slow\r\n")  # no blank line: request unfinished
        started = time.monotonic()
        assert fetch(server, timeout=5)[0] == 200
        assert time.monotonic() - started < 2
        slow.sendall(b"Connection: close\r\n\r\n")  # the slow client finishes and is served too
        reply = b""
        while chunk := slow.recv(65536):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200 OK")
    finally:
        slow.close()
        silent.close()


def test_shutdown_ends_idle_keep_alive_connections_and_closes_the_port():
    with running() as short_lived:
        port = short_lived.server_addresses[0][1]
        idle = socket.create_connection(("127.0.0.1", port), timeout=5)
        idle.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while not reply.endswith(b"\r\n\r\nOK"):
            reply += idle.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200 OK")
    try:
        assert idle.recv(65536) == b""  # the server closed the kept-alive connection
    finally:
        idle.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_shutdown_without_serve_forever_returns():
    unstarted = ExporterServer("127.0.0.1:0", "/metrics", sample_registry())
    unstarted.shutdown()
    unstarted.shutdown()


# ------------------------------------------------------------------------------- limits per client

def connect(server: ExporterServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.server_addresses[0][1]), timeout=10)


def read_until_closed(sock: socket.socket, timeout: float = 10) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the server closes the connection within `seconds` (without sending anything)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_request_line_over_8_kib_gets_414(server):
    with connect(server) as sock:
        sock.sendall(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_until_closed(sock).startswith(b"HTTP/1.1 414 ")
    assert fetch(server)[0] == 200


def test_a_request_head_over_1_mib_gets_431_and_is_not_read_further(server):
    with connect(server) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        header = b"X-Padding: " + b"a" * 8000 + b"\r\n"
        try:
            for _ in range(140):  # 1.1 MB, never finished
                sock.sendall(header)
        except OSError:
            pass
        assert read_until_closed(sock).startswith(b"HTTP/1.1 431 ")


def test_a_head_of_exactly_the_limit_is_served_and_one_byte_more_is_not():
    limit = 64 << 10
    request_line = b"GET /metrics HTTP/1.1\r\n"
    with running(limits=ServerLimits(max_header_bytes=limit)) as small:
        for extra, status in ((0, b"200"), (1, b"431")):
            padding = b"a" * (limit - len(request_line) - len(b"X-Padding: \r\n\r\n") + extra)
            head = request_line + b"X-Padding: " + padding + b"\r\n\r\n"  # the blank line counts
            assert len(head) == limit + extra
            with connect(small) as sock:
                sock.sendall(head)
                sock.settimeout(5)
                assert sock.recv(100).startswith(b"HTTP/1.1 " + status + b" ")


def test_more_than_100_header_lines_get_431(server):
    with connect(server) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n")
        assert read_until_closed(sock).startswith(b"HTTP/1.1 431 ")


def test_a_slowloris_client_is_cut_off_at_the_header_timeout_however_often_it_sends():
    with running(limits=ServerLimits(header_timeout=0.5)) as limited, connect(limited) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        try:
            while time.monotonic() - started < 5:
                sock.sendall(b"X-Still-There: yes\r\n")
                time.sleep(0.05)
        except OSError:
            pass
        assert closed_within(sock, 5)
        assert time.monotonic() - started < 2
        assert fetch(limited)[0] == 200


def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout():
    with running(limits=ServerLimits(header_timeout=0.3)) as limited, connect(limited) as sock:
        started = time.monotonic()
        assert closed_within(sock, 5)
        assert 0.25 < time.monotonic() - started < 2


def test_a_kept_alive_connection_is_closed_after_the_idle_timeout():
    with running(limits=ServerLimits(idle_timeout=0.5, header_timeout=5)) as limited:
        connection = http.client.HTTPConnection("127.0.0.1", limited.server_addresses[0][1], timeout=5)
        connection.request("GET", "/-/healthy")
        assert connection.getresponse().read() == b"OK"
        time.sleep(0.2)
        connection.request("GET", "/-/healthy")  # still open: the idle time restarts after each response
        assert connection.getresponse().read() == b"OK"
        assert closed_within(connection.sock, 3)
        connection.close()


def test_all_connections_together_hold_a_bounded_amount_of_unfinished_heads():
    """Each client stays under the per-request limit, together they pass the shared budget: the one
    holding the most is refused, the others and a scrape go on."""
    limits = ServerLimits(max_header_bytes=256 << 10, max_buffered_bytes=300 << 10)
    with running(limits=limits) as limited:
        clients = [connect(limited) for _ in range(4)]
        try:
            for number, sock in enumerate(clients):
                sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Padding: " + b"a" * ((90 + number * 10) << 10))
                time.sleep(0.1)
            assert read_until_closed(clients[3], 5).startswith(b"HTTP/1.1 431 ")
            assert fetch(limited)[0] == 200
            clients[0].sendall(b"\r\n\r\n")
            assert clients[0].recv(100).startswith(b"HTTP/1.1 200 ")
        finally:
            for sock in clients:
                sock.close()


def test_at_the_connection_cap_the_oldest_idle_connection_makes_room():
    with running(limits=ServerLimits(max_connections=8)) as limited:
        idle = [connect(limited) for _ in range(8)]
        try:
            time.sleep(0.2)
            assert fetch(limited)[0] == 200
            assert closed_within(idle[0], 2)
            assert not closed_within(idle[-1], 0.2)
        finally:
            for sock in idle:
                sock.close()


def test_at_the_connection_cap_a_scrapers_kept_alive_connection_outlives_idle_newcomers():
    """Connections that never completed a request make room first: however many of them keep coming,
    the scraper's kept-alive connection is not the one closed."""
    with running(limits=ServerLimits(max_connections=8)) as limited:
        scraper = http.client.HTTPConnection("127.0.0.1", limited.server_addresses[0][1], timeout=5)
        scraper.request("GET", "/metrics")
        assert scraper.getresponse().read()
        newcomers = [connect(limited) for _ in range(30)]
        try:
            time.sleep(0.2)
            scraper.request("GET", "/metrics")  # on the same connection: http.client does not reconnect
            assert scraper.getresponse().status == 200
            assert closed_within(newcomers[0], 2)
        finally:
            scraper.close()
            for sock in newcomers:
                sock.close()


def test_a_client_that_never_reads_its_responses_holds_no_worker():
    """With a single worker: one client pipelines requests and reads nothing (its responses pile up in
    the socket buffers); a scrape is still answered, because responses are sent by the event loop."""
    with running(limits=ServerLimits(workers=1)) as limited, connect(limited) as greedy:
        greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            greedy.settimeout(2)
            for _ in range(2000):
                greedy.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        except OSError:
            pass  # the server stopped reading: its answers are not being taken
        started = time.monotonic()
        assert fetch(limited, timeout=5)[0] == 200
        assert time.monotonic() - started < 1


def test_a_request_without_an_http_version_gets_400_not_an_http_0_9_reply(server):
    with connect(server) as sock:
        sock.sendall(b"GET /metrics\r\n\r\n")
        reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 400 ")
    assert b"sample_memory_bytes" not in reply


@pytest.mark.parametrize("line", [b"Host x", b" folded: continuation", b"Host : x", b"Na me: x", b"X-A: b\x00c",
                                  b"X-A: b\x1b[31mc", b": no-name"],
                         ids=["no-colon", "obsolete-folding", "space-before-colon", "space-in-name", "nul-in-value",
                              "escape-in-value", "empty-name"])
def test_a_malformed_header_line_gets_400(server, line):
    with connect(server) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + line + b"\r\n\r\n")
        reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 400 ")
    assert b"sample_memory_bytes" not in reply


@pytest.mark.parametrize("request_line", [b"GET /metrics HTTP/2.0", b"GET /metrics HTTP/1", b"G(T /metrics HTTP/1.1",
                                          b"GET /me\x1btrics HTTP/1.1", b"GET  /metrics HTTP/1.1"],
                         ids=["http-2", "no-minor-version", "bad-method", "control-in-target", "two-spaces"])
def test_a_malformed_request_line_is_refused(server, request_line):
    with connect(server) as sock:
        sock.sendall(request_line + b"\r\nHost: x\r\n\r\n")
        reply = read_until_closed(sock)
    assert re.match(rb"HTTP/1\.1 (400|505) ", reply), reply[:100]


def test_pipelined_requests_are_answered_in_order(server):
    with connect(server) as sock:
        sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        replies = read_until_closed(sock)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", replies) == [b"200", b"404", b"200"]


# -------------------------------------------------------------------------------------------- IPv6

def test_ipv6_loopback_listen():
    with running("[::1]:0") as v6:
        assert v6.server_addresses[0][0] == "::1"
        status, _, body = fetch(v6, host="::1")
        assert status == 200 and b"sample_memory_bytes" in body


def test_default_listen_address_is_dual_stack():
    with running(":0") as everywhere:
        assert everywhere.server_addresses[0][0] == "::"
        assert fetch(everywhere, host="127.0.0.1")[0] == 200
        assert fetch(everywhere, host="::1")[0] == 200


def test_explicit_ipv4_listen():
    with running("0.0.0.0:0") as v4:
        assert v4.server_addresses[0][0] == "0.0.0.0"
        assert fetch(v4, host="127.0.0.1")[0] == 200


# ------------------------------------------------------------------------------------------- TLS

def web_config(directory: Path, text: str) -> WebConfig:
    return load_web_config(str(write_web_config(directory, text)))


def tls_config(directory: Path, pki: Pki, **settings: str) -> WebConfig:
    return web_config(directory, tls_server_config(pki, **settings))


def mtls_config(directory: Path, pki: Pki, client_auth_type: str = "RequireAndVerifyClientCert",
                **settings: str) -> WebConfig:
    return tls_config(directory, pki, client_auth_type=client_auth_type, **settings)


def assert_rejected(server: ExporterServer, context: ssl.SSLContext) -> None:
    # With TLS 1.3 the client learns that its certificate was refused only when it reads.
    with pytest.raises((ssl.SSLError, ConnectionError)):
        fetch(server, context=context, host="localhost")


def test_tls_scrape_with_a_trusted_server_certificate(tmp_path, pki):
    with running(web_config=tls_config(tmp_path, pki)) as tls_server:
        status, _, body = fetch(tls_server, context=client_context(pki.ca_cert), host="localhost")
        assert status == 200 and b"sample_memory_bytes" in body


def test_tls_over_ipv6(tmp_path, pki):
    with running("[::1]:0", web_config=tls_config(tmp_path, pki)) as tls_server:
        assert fetch(tls_server, context=client_context(pki.ca_cert), host="::1")[0] == 200


def test_client_that_does_not_trust_the_server_ca_fails_and_the_server_survives(tmp_path, pki, caplog):
    with running(web_config=tls_config(tmp_path, pki)) as tls_server, \
            caplog.at_level(logging.DEBUG, logger="vllm_xpu_exporter.web"):
        with pytest.raises(ssl.SSLCertVerificationError):
            fetch(tls_server, context=client_context(pki.rogue_ca_cert), host="localhost")
        assert wait_for(lambda: "TLS handshake with 127.0.0.1 failed" in caplog.text)
        assert fetch(tls_server, context=client_context(pki.ca_cert), host="localhost")[0] == 200


def test_required_client_certificate_missing_is_rejected(tmp_path, pki):
    with running(web_config=mtls_config(tmp_path, pki)) as tls_server:
        assert_rejected(tls_server, client_context(pki.ca_cert))
        assert fetch(tls_server, context=client_context(pki.ca_cert, pki.client), host="localhost")[0] == 200


def test_client_certificate_from_an_unknown_ca_is_rejected(tmp_path, pki):
    with running(web_config=mtls_config(tmp_path, pki)) as tls_server:
        assert_rejected(tls_server, client_context(pki.ca_cert, pki.rogue_client))
        assert fetch(tls_server, context=client_context(pki.ca_cert, pki.client), host="localhost")[0] == 200


def test_verify_client_cert_if_given_admits_anonymous_clients_but_not_bad_certificates(tmp_path, pki):
    with running(web_config=mtls_config(tmp_path, pki, "VerifyClientCertIfGiven")) as tls_server:
        assert fetch(tls_server, context=client_context(pki.ca_cert), host="localhost")[0] == 200
        assert fetch(tls_server, context=client_context(pki.ca_cert, pki.client), host="localhost")[0] == 200
        assert_rejected(tls_server, client_context(pki.ca_cert, pki.rogue_client))


def test_client_allowed_sans_gate_verified_client_certificates(tmp_path, pki):
    san = CLIENT_SAN.split(":", 1)[1]
    (tmp_path / "allowed").mkdir()
    (tmp_path / "refused").mkdir()
    allowed = mtls_config(tmp_path / "allowed", pki, client_allowed_sans=f"[{san}]")
    refused = mtls_config(tmp_path / "refused", pki, client_allowed_sans="[someone-else.test]")
    with running(web_config=allowed) as tls_server:
        assert fetch(tls_server, context=client_context(pki.ca_cert, pki.client), host="localhost")[0] == 200
    with running(web_config=refused) as tls_server:
        assert_rejected(tls_server, client_context(pki.ca_cert, pki.client))


def test_plain_http_to_the_tls_port_gets_400_and_the_server_keeps_serving_tls(tmp_path, pki):
    with running(web_config=tls_config(tmp_path, pki)) as tls_server:
        status, _, body = fetch(tls_server)
        assert status == 400
        assert body == b"Client sent an HTTP request to an HTTPS server.\n"
        with socket.create_connection(("127.0.0.1", tls_server.server_addresses[0][1]), timeout=5) as garbage:
            garbage.sendall(b"\x00\x01\x02\x03")
            assert garbage.recv(100) == b""
        assert fetch(tls_server, context=client_context(pki.ca_cert), host="localhost")[0] == 200


def test_a_client_stalling_the_tls_handshake_does_not_block_others(tmp_path, pki):
    with running(web_config=tls_config(tmp_path, pki)) as tls_server:
        with socket.create_connection(("127.0.0.1", tls_server.server_addresses[0][1]), timeout=5) as stalled:
            stalled.sendall(b"\x16\x03\x01")  # the start of a ClientHello, never finished
            started = time.monotonic()
            assert fetch(tls_server, context=client_context(pki.ca_cert), host="localhost", timeout=5)[0] == 200
            assert time.monotonic() - started < 2


# ------------------------------------------------------------------------------------ basic auth, headers

def auth_config(directory: Path, extra: str = "") -> WebConfig:
    return web_config(directory, basic_auth_users({"alice": PASSWORD_HASH}) + extra)


def test_basic_auth_missing_credentials_get_401_with_challenge(tmp_path):
    with running(web_config=auth_config(tmp_path)) as auth_server:
        for path in ("/metrics", "/", "/nope"):
            status, headers, body = fetch(auth_server, path)
            assert status == 401
            assert headers["WWW-Authenticate"] == "Basic"
            assert b"sample" not in body


def test_basic_auth_wrong_password_or_unknown_user_get_401(tmp_path):
    with running(web_config=auth_config(tmp_path)) as auth_server:
        assert fetch(auth_server, headers=basic("alice", "wrong"))[0] == 401
        assert fetch(auth_server, headers=basic("mallory", PASSWORD))[0] == 401


def test_basic_auth_right_password_gets_metrics(tmp_path):
    with running(web_config=auth_config(tmp_path)) as auth_server:
        status, _, body = fetch(auth_server, headers=basic("alice", PASSWORD))
        assert status == 200 and b"sample_memory_bytes" in body


def test_a_flood_of_wrong_passwords_does_not_hold_up_a_scraper_with_known_credentials(tmp_path):
    """bcrypt at a high cost keeps a worker busy; wrong passwords beyond two at a time get 429 at once,
    so they cannot take every worker and the scraper (verified before, answered from a cache) gets one."""
    slow_hash = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(12)).decode()  # ~0.25 s a check here
    with running(web_config=web_config(tmp_path, basic_auth_users({"alice": slow_hash}))) as auth_server:
        assert fetch(auth_server, headers=basic("alice", PASSWORD))[0] == 200
        stop = threading.Event()
        statuses: list[int] = []

        def flood() -> None:
            while not stop.is_set():
                statuses.append(fetch(auth_server, headers=basic("alice", "guess"))[0])

        attackers = [threading.Thread(target=flood, daemon=True) for _ in range(8)]
        for attacker in attackers:
            attacker.start()
        try:
            time.sleep(0.3)
            slowest = 0.0
            for _ in range(10):
                started = time.monotonic()
                assert fetch(auth_server, headers=basic("alice", PASSWORD))[0] == 200
                slowest = max(slowest, time.monotonic() - started)
                time.sleep(0.05)
        finally:
            stop.set()
            for attacker in attackers:
                attacker.join(10)
        assert slowest < 0.2, f"a scrape waited {slowest:.2f} s"
        assert set(statuses) <= {401, 429} and 429 in statuses


def mtls_with_basic_auth_config(tmp_path, pki):
    """A web config requiring a verified client certificate and alice's password."""
    return web_config(tmp_path, tls_server_config(pki, client_auth_type="RequireAndVerifyClientCert")
                      + basic_auth_users({"alice": PASSWORD_HASH}))


def test_basic_auth_over_tls_with_client_certificate(tmp_path, pki):
    config = mtls_with_basic_auth_config(tmp_path, pki)
    with running(web_config=config) as tls_server:
        context = client_context(pki.ca_cert, pki.client)
        assert fetch(tls_server, context=context, host="localhost")[0] == 401
        assert fetch(tls_server, context=context, host="localhost", headers=basic("alice", PASSWORD))[0] == 200


def test_configured_headers_are_sent_on_every_response(tmp_path):
    config = auth_config(tmp_path, "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
                                   "    X-Content-Type-Options: nosniff\n")
    with running(web_config=config) as header_server:
        for headers in ({}, basic("alice", PASSWORD)):
            for path in ("/metrics", "/nope"):
                _, response_headers, _ = fetch(header_server, path, headers=headers)
                assert response_headers["X-Frame-Options"] == "deny"
                assert response_headers["X-Content-Type-Options"] == "nosniff"


def test_rate_limit_answers_429_when_the_burst_is_spent(tmp_path):
    with running(web_config=web_config(tmp_path, "rate_limit:\n  interval: 1h\n  burst: 2\n")) as limited:
        assert [fetch(limited)[0] for _ in range(3)] == [200, 200, 429]


def test_changes_to_the_web_config_file_apply_once_loaded(tmp_path):
    config = auth_config(tmp_path)
    with running(web_config=config) as auth_server:
        assert fetch(auth_server, headers=basic("alice", PASSWORD))[0] == 200
        path = Path(str(config.source_path))
        path.write_text(basic_auth_users({"bob": PASSWORD_HASH}))
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))
        assert wait_for(lambda: fetch(auth_server, headers=basic("bob", PASSWORD))[0] == 200)
        assert fetch(auth_server, headers=basic("alice", PASSWORD))[0] == 401


# ----------------------------------------------------------------------------------------------- curl

def test_curl_over_tls_with_client_certificate_and_basic_auth(tmp_path, pki):
    config = mtls_with_basic_auth_config(tmp_path, pki)
    with running(web_config=config) as tls_server:
        url = f"https://localhost:{tls_server.server_addresses[0][1]}/metrics"
        with_cert = ["--cacert", str(pki.ca_cert), "--cert", str(pki.client.cert), "--key", str(pki.client.key)]

        ok = curl(*with_cert, "--user", f"alice:{PASSWORD}", "--write-out", "%{http_code}", url)
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.endswith("200") and "sample_memory_bytes" in ok.stdout

        wrong = curl(*with_cert, "--user", "alice:wrong", "--write-out", "%{http_code}", "--output", "/dev/null", url)
        assert wrong.stdout == "401"

        without_cert = curl("--cacert", str(pki.ca_cert), "--user", f"alice:{PASSWORD}", url)
        assert without_cert.returncode != 0

        untrusted = curl("--cacert", str(pki.rogue_ca_cert), *with_cert[2:], url)
        assert untrusted.returncode == 60  # peer certificate cannot be authenticated with known CA certificates


def test_the_exporter_serves_the_runbook_it_ships_with_an_anchor_for_every_alert():
    """GET /runbook: docs/runbook.md as HTML, each alert's section under the anchor its runbook_url ends with
    (the page the rules' runbook_url leads to, as Prometheus serves it); the landing page links to it."""
    alerts = re.findall(r"^## (Xpu\w+)$", (Path(__file__).resolve().parents[2] / "docs" / "runbook.md").read_text(), re.M)
    assert alerts
    with running() as server:
        status, headers, body = fetch(server, "/runbook")
        _, _, landing = fetch(server, "/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    page = body.decode()
    for alert in alerts:
        assert f'<h2 id="{alert.lower()}">{alert}</h2>' in page
    assert "kubectl logs -n &lt;namespace&gt; &lt;pod&gt; -c &lt;container&gt; --previous" in page
    assert b'href="/runbook"' in landing
