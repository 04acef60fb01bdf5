"""The harness that runs the exporter as a process (tests/exporterproc.py): what the process logged before
it answered a request is in `stderr` as soon as the answer is in, so tests can read it without waiting."""

from __future__ import annotations

import sys

from exporterproc import RunningExporter

# Stands in for the exporter: says where it listens the way the exporter does, and before it answers each
# request logs a burst of lines (as a failing collector's traceback at debug level can be) ending in a
# numbered one, flushed as logging's stream handler does. The burst fits the pipe, so the write never waits
# for the reader.
LOGS_THEN_ANSWERS = r'''
import http.server, sys
count = 0
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global count
        count += 1
        sys.stderr.write("level=debug msg=filler\n" * 2000 + f"level=warn msg=\"answered {count}\"\n")
        sys.stderr.flush()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
host, port = sys.argv[sys.argv.index("--web.listen-address") + 1].rsplit(":", 1)
server = http.server.HTTPServer((host, int(port)), Handler)
sys.stderr.write(f"level=info msg=\"listening on http://{host}:{server.server_port}/metrics \"\n")
sys.stderr.flush()
server.serve_forever()
'''


def test_a_line_logged_before_the_answer_is_in_stderr_when_the_answer_is():
    with RunningExporter(command=[sys.executable, "-c", LOGS_THEN_ANSWERS]) as process:
        for count in range(1, 51):
            status, _, _ = process.get("/")
            assert status == 200
            assert f"answered {count}\"" in process.stderr, f"request {count}'s line is not there yet"
