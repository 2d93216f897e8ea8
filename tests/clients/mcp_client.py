#!/usr/bin/env python3
"""The MCP Python SDK's Streamable HTTP client, as an agent would use it through Ostiary.

usage: mcp_client.py [--header NAME:VALUE]... URL [TOOL JSON_ARGS]...

Connects to URL (HTTPS_PROXY and SSL_CERT_FILE from the environment, passed explicitly to
the SDK's httpx2 client), initializes, lists the tools, then calls each TOOL with its
JSON arguments. Prints one JSON line:
{"tools": [names], "calls": [{"tool", "result": [texts], "is_error"} | {"tool", "error":
{"code", "message", "data"}}]}. A failure outside the calls prints {"error": "..."} and
exits 3. `--header` adds a header to every request of the session (e.g.
`Ostiary-Approval: <id>`, to collect a call held for approval).
"""

import asyncio
import json
import ssl
import sys

from _common import ca_bundle, emit, fail, proxy_for


async def run(url, calls, headers):
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    bundle = ca_bundle()
    verify = ssl.create_default_context(cafile=bundle) if bundle else True
    http = httpx2.AsyncClient(
        proxy=proxy_for(url), verify=verify, trust_env=False, timeout=httpx2.Timeout(30.0),
        headers=headers,
    )
    out = {"tools": [], "calls": []}
    async with http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                out["tools"] = [t.name for t in listed.tools]
                for name, args in calls:
                    try:
                        result = await session.call_tool(name, args)
                        texts = [getattr(c, "text", None) for c in result.content]
                        out["calls"].append({"tool": name, "result": texts, "is_error": result.is_error})
                    except MCPError as exc:
                        out["calls"].append({
                            "tool": name,
                            "error": {"code": exc.code, "message": exc.message, "data": exc.data},
                        })
    return out


def main():
    args = sys.argv[1:]
    headers = {}
    while args and args[0] == "--header":
        name, _, value = args[1].partition(":")
        headers[name.strip()] = value.strip()
        args = args[2:]
    url = args[0]
    rest = args[1:]
    calls = [(rest[i], json.loads(rest[i + 1])) for i in range(0, len(rest) - 1, 2)]
    try:
        emit(asyncio.run(run(url, calls, headers)))
    except Exception as exc:  # noqa: BLE001 - any failure is reported as one JSON line
        import traceback

        traceback.print_exc()
        return fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
