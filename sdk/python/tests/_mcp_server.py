"""A real MCP server (the MCP Python SDK's ``MCPServer``, Streamable HTTP, behind TLS) in a
thread: tools ``read_file`` (allowed), ``write_file`` (forbidden by policy) and
``delete_file`` (escalated for approval), over an in-memory dict.

uvicorn is given a socket already bound to 127.0.0.1:0, so there is no race for a port.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

from _pki import Certs


class McpUpstream:
    def __init__(self, certs: Certs) -> None:
        self.files = {"/notes.txt": "hello"}
        self.deleted: list[str] = []
        files, deleted = self.files, self.deleted
        server = MCPServer("files")

        @server.tool()
        def read_file(path: str) -> str:
            """Read a file."""
            return files.get(path, "")

        @server.tool()
        def write_file(path: str, content: str) -> str:
            """Write a file."""
            files[path] = content
            return "ok"

        @server.tool()
        def delete_file(path: str) -> str:
            """Delete a file."""
            deleted.append(path)
            files.pop(path, None)
            return f"deleted {path}"

        app = server.streamable_http_app(
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            ssl_certfile=str(certs.chain),
            ssl_keyfile=str(certs.key),
            log_level="warning",
            lifespan="on",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the MCP server did not start")
            time.sleep(0.05)

    def url(self, host: str) -> str:
        return f"https://{host}:{self.port}/mcp"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
