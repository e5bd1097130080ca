"""A find-links page on 127.0.0.1 that serves wheel files slowly, so a test can kill a download midway."""

from __future__ import annotations

import html
import http.server
import threading
import time
from pathlib import Path


class SlowWheels:
    """``http://127.0.0.1:PORT/`` lists ``files`` (an HTML find-links page); each file is sent at
    ``bytes_per_s`` per connection. Use as a context manager."""

    def __init__(self, files: list[Path], bytes_per_s: int):
        self.files = {f.name: f for f in files}
        self.rate = bytes_per_s
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                name = self.path.lstrip("/").split("?")[0]
                if name == "":
                    body = "".join(f'<a href="{html.escape(n)}">{html.escape(n)}</a>\n'
                                   for n in sorted(outer.files)).encode()
                    self._send(200, body, "text/html")
                    return
                f = outer.files.get(name)
                if f is None:
                    self._send(404, b"not here\n", "text/plain")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(f.stat().st_size))
                self.end_headers()
                chunk = max(1, outer.rate // 20)
                try:
                    with open(f, "rb") as src:
                        while data := src.read(chunk):
                            self.wfile.write(data)
                            time.sleep(len(data) / outer.rate)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client was killed: what the tests do

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "SlowWheels":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
