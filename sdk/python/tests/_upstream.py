"""The loopback HTTPS upstreams: one of this suite's own that records what reached it, and
the MCP server the Rust MCP tests run too.

:class:`Upstream`'s routes (any host name; the proxy resolves the test names to 127.0.0.1):

- ``GET /items/<id>`` → ``200 {"id", "method"}``
- ``POST /items/<id>`` → ``201 {"id", "applied", "idempotency_key", "body"}``; ``applied``
  counts the POSTs that reached this path, so a test can tell "ran once" from "ran twice"
- ``DELETE /items/<id>`` → ``200 {"deleted", "applied"}``
- ``GET /own-refusal`` → the upstream's *own* ``403`` with an Ostiary-looking body and no
  ``Ostiary-Request-Id``: an SDK must hand it back, not raise
- anything else → ``404``

:class:`McpUpstream` is ``tests/clients/mcp_server.py`` (tools ``read_file``, ``write_file``,
``delete_file`` over an in-memory dict holding ``/notes.txt = "hello"``) as a child process.
It keeps no record of the calls it ran: what the proxy executed is in the audit trail
(``_rig.executed``).
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _pki import Certs
from _proxy import REPO, clean_env, free_port

#: The MCP server of the Rust MCP tests (tests/tests/support/mcp.rs), shared with them.
MCP_SERVER = REPO / "tests" / "clients" / "mcp_server.py"
#: What ``mcp_server.py`` exits with when its port was taken meanwhile.
_PORT_TAKEN = 4


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Upstream:
    def __init__(self, certs: Certs) -> None:
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                seen = Seen(
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                )
                with upstream._lock:
                    upstream.seen.append(seen)
                    applied = sum(
                        1 for s in upstream.seen if s.path == self.path and s.method == self.command
                    )
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[0] == "own-refusal":
                    self._answer(
                        403,
                        {"error": "denied", "message": "the upstream's own refusal", "policies": ["x"]},
                    )
                elif parts[0] == "items" and len(parts) == 2:
                    item = parts[1]
                    if self.command == "GET":
                        self._answer(200, {"id": item, "method": "GET"})
                    elif self.command == "POST":
                        try:
                            parsed = json.loads(body) if body else None
                        except ValueError:
                            parsed = body.decode("utf-8", "replace")
                        self._answer(
                            201,
                            {
                                "id": item,
                                "applied": applied,
                                "idempotency_key": self.headers.get("idempotency-key"),
                                "body": parsed,
                            },
                        )
                    elif self.command == "DELETE":
                        self._answer(200, {"deleted": item, "applied": applied})
                    else:
                        self._answer(405, {"message": "method not allowed"})
                else:
                    self._answer(404, {"message": f"no route {self.path}"})

            do_GET = do_POST = do_DELETE = do_PUT = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certs.chain, certs.key)
        self._server.socket = context.wrap_socket(
            self._server.socket, server_side=True, do_handshake_on_connect=False
        )
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def count(self, method: str, path: str) -> int:
        with self._lock:
            return sum(1 for s in self.seen if s.method == method and s.path == path)

    def requests_to(self, path: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.path == path]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class McpUpstream:
    """``mcp_server.py PORT CERT_CHAIN_PEM KEY_PEM`` on a free port (another one when it was
    taken meanwhile), with this suite's interpreter, once it accepts connections."""

    def __init__(self, certs: Certs, dir: Path) -> None:
        if not MCP_SERVER.is_file():
            raise RuntimeError(f"the shared MCP server is not at {MCP_SERVER}")
        self._log = dir / "mcp_server.log"
        for _ in range(5):
            self.port = free_port()
            with open(self._log, "wb") as log:
                self._process = subprocess.Popen(
                    [sys.executable, MCP_SERVER, str(self.port), certs.chain, certs.key],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    env=clean_env(PYTHONDONTWRITEBYTECODE="1"),
                )
            if self._listening():
                return
            if self._process.returncode != _PORT_TAKEN:
                raise RuntimeError(f"{MCP_SERVER} did not start:\n{self._output()}")
        raise RuntimeError(f"no free port for {MCP_SERVER} after 5 tries")

    def _listening(self) -> bool:
        """Whether it accepts connections within 30 s (``False``: it exited first)."""
        deadline = time.monotonic() + 30
        while self._process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{MCP_SERVER} did not listen within 30 s:\n{self._output()}")
            time.sleep(0.05)
        return False

    def _output(self) -> str:
        return self._log.read_text(errors="replace")

    def url(self, host: str) -> str:
        return f"https://{host}:{self.port}/mcp"

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
