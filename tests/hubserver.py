"""A stand-in for the Hugging Face hub on 127.0.0.1: real files, the hub's URLs and headers, and faults on demand.

It answers what `huggingface_hub` asks when it pulls: the repo listing
(`GET /api/models/{repo}/revision/{rev}`, with sizes and LFS SHA-256 when
`blobs=true`) and each file (`HEAD` and `GET /{repo}/resolve/{rev}/{file}` with
`X-Repo-Commit`, `ETag`, `Content-Length`, and `Range` for resuming). It counts
the bytes it serves per file and can drop a connection after N bytes, fail a
file, stall, slow down, or damage a file's bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_LISTING = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


@dataclass
class Faults:
    drop_after: dict[str, int] = field(default_factory=dict)  # file -> bytes; once, then served whole
    fail: set[str] = field(default_factory=set)  # file -> 500 on every GET
    stall_after: dict[str, int] = field(default_factory=dict)  # file -> bytes, then silence (no close)
    damage: set[str] = field(default_factory=set)  # file -> one byte flipped, size unchanged
    bytes_per_s: float | None = None  # throttle every GET


@dataclass
class Repo:
    files: dict[str, Path]
    sha256: dict[str, str]
    commit: str


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.faults = Faults()
        self.served: Counter[str] = Counter()  # "repo/file" -> body bytes written
        self.gets: list[tuple[str, str | None]] = []  # ("repo/file", Range header)
        self._stop = threading.Event()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._file(self, body=False)

            def do_GET(self) -> None:
                if _LISTING.match(urlsplit(self.path).path):
                    hub._listing(self)
                else:
                    hub._file(self, body=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-hub", daemon=True)

    def add(self, repo: str, files: dict[str, Path]) -> None:
        sha = {name: _sha256(path) for name, path in files.items()}
        self.repos[repo] = Repo(files, sha, hashlib.sha1(repo.encode()).hexdigest())

    def reset(self) -> None:
        self.faults = Faults()
        self.served.clear()
        self.gets.clear()

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    # --- answers -----------------------------------------------------------------------
    def _listing(self, h: BaseHTTPRequestHandler) -> None:
        repo_id = _LISTING.match(urlsplit(h.path).path).group(1)
        repo = self.repos.get(repo_id)
        if repo is None:
            return _send(h, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
        siblings = []
        for name, path in repo.files.items():
            size = path.stat().st_size
            entry = {"rfilename": name, "size": size, "blobId": repo.sha256[name][:40]}
            if size > 1_000_000:  # large files live in LFS on the hub, listed with their SHA-256
                entry["lfs"] = {"sha256": repo.sha256[name], "size": size, "pointerSize": 134}
            siblings.append(entry)
        body = json.dumps({"id": repo_id, "sha": repo.commit, "siblings": siblings, "private": False}).encode()
        _send(h, 200, body, {"Content-Type": "application/json"})

    def _file(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        match = _RESOLVE.match(urlsplit(h.path).path)
        repo = self.repos.get(match.group(1)) if match else None
        name = unquote(match.group(3)) if match else ""
        if repo is None or name not in repo.files:
            return _send(h, 404, b"", {"X-Error-Code": "EntryNotFound" if repo else "RepoNotFound"}, body)
        key, path = f"{match.group(1)}/{name}", repo.files[name]
        size = path.stat().st_size
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{repo.sha256[name]}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if size > 1_000_000:
            headers.update({"X-Linked-Etag": f'"{repo.sha256[name]}"', "X-Linked-Size": str(size)})
        if not body:
            return _send(h, 200, b"", {**headers, "Content-Length": str(size)}, False)
        self.gets.append((key, h.headers.get("Range")))
        if name in self.faults.fail:
            return _send(h, 500, b"the fake hub fails this file on purpose", {})
        start = int(re.match(r"bytes=(\d+)-", h.headers.get("Range", "bytes=0-")).group(1))
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        h.send_response(status)
        for k, v in {**headers, "Content-Length": str(size - start)}.items():
            h.send_header(k, v)
        h.end_headers()
        drop = self.faults.drop_after.pop(name, None)
        stall = self.faults.stall_after.get(name)
        with open(path, "rb") as f:
            f.seek(start)
            position = start
            while chunk := f.read(1 << 20):
                if name in self.faults.damage and position <= size // 2 < position + len(chunk):
                    chunk = bytearray(chunk)
                    chunk[size // 2 - position] ^= 0xFF
                    chunk = bytes(chunk)
                limit = min(x for x in (drop, stall, position + len(chunk)) if x is not None)
                piece = chunk[: max(0, limit - position)]
                try:
                    h.wfile.write(piece)
                    h.wfile.flush()
                except OSError:
                    return
                self.served[key] += len(piece)
                position += len(piece)
                if drop is not None and position >= drop:
                    h.connection.shutdown(socket.SHUT_RDWR)  # the peer goes away mid-body
                    h.close_connection = True
                    return
                if stall is not None and position >= stall:
                    self._stop.wait(60)  # silence, the connection left open
                    h.close_connection = True
                    return
                if self.faults.bytes_per_s:
                    time.sleep(len(piece) / self.faults.bytes_per_s)


def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict, with_body: bool = True) -> None:
    h.send_response(status)
    for k, v in headers.items():
        h.send_header(k, v)
    if "Content-Length" not in headers:
        h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    if with_body and body:
        h.wfile.write(body)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
