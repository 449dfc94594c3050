"""A loopback server speaking the part of the Hugging Face Hub's file API that ``huggingface_hub`` calls to download
a model (tests point ``HF_ENDPOINT`` at it):

- ``GET /api/models/{repo}[/revision/{rev}]`` (``HfApi.model_info``): ``sha`` and ``siblings`` with sizes;
  an unknown repo is 401 ``X-Error-Code: RepoNotFound``, an unknown revision 404 ``RevisionNotFound``;
- ``HEAD``/``GET /{repo}/resolve/{rev}/{filename}`` (``hf_hub_download``): ``X-Repo-Commit``, ``ETag`` and
  ``Content-Length``; ``Range: bytes=N-`` answered 206; a gated repo without the right ``Authorization`` is
  401 (403 with another token) ``X-Error-Code: GatedRepo``.

It logs every request, and can drop the connection mid-body for a chosen file (the client must resume).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    gated_token: str | None = None  # set: the repo is gated, this token has access


@dataclass
class Request:
    method: str
    repo: str
    filename: str | None  # None: the API
    range: str | None
    status: int = 0  # the answer's


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    log: list[Request] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)  # "repo/filename": the next N GETs send half, then hang up
    starves: dict[str, int] = field(default_factory=dict)  # then the next N send no byte of the body
    url: str = ""

    def add(self, repo_id: str, directory: Path, gated_token: str | None = None, extra: dict[str, bytes] | None = None
            ) -> Repo:  # fmt: skip
        files = {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}
        files.update(extra or {})
        commit = hashlib.sha1(repo_id.encode() + b"".join(files.values())).hexdigest()
        self.repos[repo_id] = Repo(files, commit, gated_token)
        return self.repos[repo_id]

    def weight_requests(self, repo_id: str) -> list[Request]:
        return [r for r in self.log if r.repo == repo_id and (r.filename or "").endswith(".safetensors")]


_API = re.compile(r"/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?")
_RESOLVE = re.compile(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)")


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        entry: Request | None = None

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                   send_body: bool = True) -> None:  # fmt: skip
            if self.entry is not None:
                self.entry.status = status
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body and body and self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self._reply(status, body, {"X-Error-Code": code, "X-Error-Message": message,
                                       "Content-Type": "application/json"})  # fmt: skip

        def _revision(self, repo: Repo, rev: str | None) -> bool:
            return rev in (None, "main", repo.commit)

        def do_GET(self) -> None:
            self._serve(send_body=True)

        def do_HEAD(self) -> None:
            self._serve(send_body=False)

        def _serve(self, send_body: bool) -> None:
            self.entry = None
            path = unquote(urlsplit(self.path).path)
            if m := _API.fullmatch(path):
                repo_id, rev = m.group(1), m.group(2)
                self.entry = Request(self.command, repo_id, None, None)
                hub.log.append(self.entry)
                return self._api(repo_id, rev)
            if m := _RESOLVE.fullmatch(path):
                repo_id, rev, name = m.groups()
                self.entry = Request(self.command, repo_id, name, self.headers.get("Range"))
                hub.log.append(self.entry)
                return self._resolve(repo_id, rev, name, send_body)
            self._error(404, "NotFound", f"no route {path}")

        def _api(self, repo_id: str, rev: str | None) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound", "Repository not found")
            if not self._revision(repo, rev):
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            siblings = [{"rfilename": n, "size": len(b), "blobId": hashlib.sha1(b).hexdigest()}
                        for n, b in repo.files.items()]  # fmt: skip
            info = {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                    "gated": "manual" if repo.gated_token else False, "siblings": siblings}  # fmt: skip
            self._reply(200, json.dumps(info).encode(), {"Content-Type": "application/json"})

        def _resolve(self, repo_id: str, rev: str, name: str, send_body: bool) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound", "Repository not found")
            auth = self.headers.get("Authorization")
            if repo.gated_token is not None and auth != f"Bearer {repo.gated_token}":  # 403: a token without access
                return self._error(403 if auth else 401, "GatedRepo", "Access to model is restricted")
            if not self._revision(repo, rev):
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            body = repo.files.get(name)
            if body is None:
                return self._error(404, "EntryNotFound", f"{name} does not exist")
            headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{hashlib.sha256(body).hexdigest()}"',
                       "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}  # fmt: skip
            start = 0
            if (r := self.headers.get("Range")) and send_body:
                start = int(re.fullmatch(r"bytes=(\d+)-", r).group(1))  # type: ignore[union-attr]
                headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
            part = body[start:]
            headers["Content-Length"] = str(len(part))
            key = f"{repo_id}/{name}"
            if send_body and (hub.drops.get(key) or hub.starves.get(key)):
                half = bool(hub.drops.get(key))
                counter = hub.drops if half else hub.starves
                counter[key] -= 1
                self._reply(206 if start else 200, b"", headers, send_body=False)
                self.wfile.write(part[: len(part) // 2] if half else b"")
                self.wfile.flush()
                self.close_connection = True
                return
            self._reply(206 if start else 200, part, headers, send_body=send_body)

    return Handler


class HubServer:
    """``with HubServer() as hub:`` a ``FakeHub`` served on 127.0.0.1 (``hub.url``)."""

    def __init__(self) -> None:
        self.hub = FakeHub()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.hub))
        self.server.daemon_threads = True
        self.hub.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self.hub

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
