#!/usr/bin/env python3
"""The MCP Python SDK's Streamable HTTP client, as an agent would use it through Ostiary.

usage: mcp_client.py [--header NAME:VALUE]... [--revision R [--rounds N]] URL [TOOL JSON_ARGS]...

Connects to URL (HTTPS_PROXY and SSL_CERT_FILE from the environment, passed explicitly to
the SDK's httpx2 client), initializes, lists the tools, then calls each TOOL with its
JSON arguments. Prints one JSON line:
{"tools": [names], "calls": [{"tool", "result": [texts], "is_error"} | {"tool", "error":
{"code", "message", "data"}}]}. A failure outside the calls prints {"error": "..."} and
exits 3. `--header` adds a header to every request of the session (e.g.
`Ostiary-Approval: <id>`, to collect a call held for approval). `--revision 2026-07-28` speaks
that revision through the SDK's `Client` (no `initialize`, no session id), following
`input_required` results up for at most `--rounds` retries (the SDK's default otherwise).
"""

import asyncio
import json
import ssl
import sys

from _common import ca_bundle, emit, fail, proxy_for


async def calls_of(call_tool, calls, out):
    from mcp.shared.exceptions import MCPError

    for name, args in calls:
        try:
            result = await call_tool(name, args)
            texts = [getattr(c, "text", None) for c in result.content]
            out["calls"].append({"tool": name, "result": texts, "is_error": result.is_error})
        except MCPError as exc:
            out["calls"].append({
                "tool": name,
                "error": {"code": exc.code, "message": exc.message, "data": exc.data},
            })
        except Exception as exc:  # noqa: BLE001 - e.g. the SDK giving up on its rounds
            out["calls"].append({"tool": name, "error": {"type": type(exc).__name__, "message": str(exc)}})


async def run(url, calls, headers, revision=None, rounds=None):
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    bundle = ca_bundle()
    verify = ssl.create_default_context(cafile=bundle) if bundle else True
    http = httpx2.AsyncClient(
        proxy=proxy_for(url), verify=verify, trust_env=False, timeout=httpx2.Timeout(30.0),
        headers=headers,
    )
    out = {"tools": [], "calls": []}
    async with http:
        if revision is not None:
            from mcp.client.client import Client

            options = {"mode": revision}
            if rounds is not None:
                options["input_required_max_rounds"] = rounds
            async with Client(streamable_http_client(url, http_client=http), **options) as client:
                listed = await client.list_tools()
                out["tools"] = [t.name for t in listed.tools]
                await calls_of(client.call_tool, calls, out)
            return out
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                out["tools"] = [t.name for t in listed.tools]
                await calls_of(session.call_tool, calls, out)
    return out


def main():
    args = sys.argv[1:]
    headers = {}
    while args and args[0] == "--header":
        name, _, value = args[1].partition(":")
        headers[name.strip()] = value.strip()
        args = args[2:]
    revision = rounds = None
    while args and args[0] in ("--revision", "--rounds"):
        if args[0] == "--revision":
            revision = args[1]
        else:
            rounds = int(args[1])
        args = args[2:]
    url = args[0]
    rest = args[1:]
    calls = [(rest[i], json.loads(rest[i + 1])) for i in range(0, len(rest) - 1, 2)]
    try:
        emit(asyncio.run(run(url, calls, headers, revision, rounds)))
    except Exception as exc:  # noqa: BLE001 - any failure is reported as one JSON line
        import traceback

        traceback.print_exc()
        return fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
