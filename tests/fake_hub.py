"""A local stand-in for the Hugging Face Hub's file endpoint, for download tests.

It answers HEAD and GET of /{repo_id}/resolve/{revision}/{filename} with what
huggingface_hub reads (file_download.get_hf_file_metadata): X-Repo-Commit, the
LFS file's sha256 as X-Linked-Etag (and ETag), its size as X-Linked-Size and
Content-Length; GET honours "Range: bytes=N-" with 206 and Content-Range, and
sends the body in 64 KiB pieces so a client can stop half-way. Point
huggingface_hub at it with HF_ENDPOINT=hub.url.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PIECE = 64 << 10
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Served:
    data: bytes
    corrupt: bool = False  # send other bytes than the checksum announces
    # Stop sending at this offset until `go` is set (a stalled connection).
    hold_at: int | None = None
    go: threading.Event = field(default_factory=threading.Event)
    ranges: list[str | None] = field(default_factory=list)  # Range header of each GET
    sent: list[int] = field(default_factory=list)  # body bytes written by each GET

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a client that hung up (a cancelled download) is not an error here


class FakeHub:
    def __init__(self):
        self.files: dict[str, Served] = {}  # "{repo_id}/{filename}" -> file
        self.ignore_range = False  # answer a Range request with the whole file (200)
        self.hub_headers = True  # False: answer like any web server (no X-Repo-Commit)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def do_GET(self) -> None:
                hub._answer(self, body=True)

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, repo_id: str, filename: str, data: bytes) -> Served:
        self.files[f"{repo_id}/{filename}"] = served = Served(data)
        return served

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        repo_and_file = handler.path.split("?")[0].lstrip("/").replace("/resolve/main/", "/", 1)
        served = self.files.get(repo_and_file)
        if served is None:
            handler.send_response(404)
            handler.send_header("X-Error-Code", "EntryNotFound")
            handler.send_header("X-Repo-Commit", COMMIT)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        size = len(served.data)
        start = 0
        asked = handler.headers.get("Range")
        if body:
            served.ranges.append(asked)
            served.sent.append(0)
            get = len(served.sent) - 1
        if asked and not self.ignore_range:
            start = int(asked.removeprefix("bytes=").split("-")[0])
        handler.send_response(206 if start else 200)
        if self.hub_headers:
            handler.send_header("X-Repo-Commit", COMMIT)
        handler.send_header("ETag", f'"{served.sha256}"')
        handler.send_header("X-Linked-Etag", f'"{served.sha256}"')
        handler.send_header("X-Linked-Size", str(size))
        handler.send_header("Accept-Ranges", "bytes")
        handler.send_header("Content-Length", str(size - start))
        if start:
            handler.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        handler.end_headers()
        if not body:
            return
        data = served.data
        if served.corrupt:
            middle = size // 2
            data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
        try:
            for offset in range(start, size, PIECE):
                if served.hold_at is not None and offset >= served.hold_at:
                    served.go.wait(30)
                piece = data[offset:offset + PIECE]
                served.sent[get] += len(piece)  # counted first: the client may finish before write() returns
                handler.wfile.write(piece)
                handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading (cancelled)
