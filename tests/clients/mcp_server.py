#!/usr/bin/env python3
"""A filesystem-like MCP server (the MCP Python SDK's MCPServer, Streamable HTTP) behind TLS.

usage: mcp_server.py PORT CERT_CHAIN_PEM KEY_PEM [--json] [--stateless]

Serves https://<any name>:PORT/mcp on 127.0.0.1 with the tools `read_file`, `write_file` and
`delete_file`, which act on an in-memory dict (nothing touches the disk), the resource
`file:///notes.txt` and the prompt `summarize`. DNS-rebinding
protection is off: the test reaches it under a made-up name through the proxy. Prints
"ready" once listening is about to start; exits 4 if the port is taken, so the caller can
pick another. `--json` answers POSTs with `application/json` instead of SSE; `--stateless`
takes requests without an `initialize` handshake (for hand-written JSON-RPC).
"""

import errno
import socket
import sys


def main():
    port, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    # Fail fast (and distinguishably) on a port conflict instead of inside uvicorn.
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return 4
        raise
    finally:
        probe.close()

    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from mcp.server.transport_security import TransportSecuritySettings

    files = {"/notes.txt": "hello"}
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
        files.pop(path, None)
        return "deleted"

    @server.resource("file:///notes.txt")
    def notes() -> str:
        """The notes, as a resource."""
        return files.get("/notes.txt", "")

    @server.prompt()
    def summarize(topic: str) -> str:
        """A prompt."""
        return f"Summarize {topic}."

    app = server.streamable_http_app(
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        json_response="--json" in sys.argv[4:],
        stateless_http="--stateless" in sys.argv[4:],
    )
    print("ready", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, ssl_certfile=cert, ssl_keyfile=key, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
