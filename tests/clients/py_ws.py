#!/usr/bin/env python3
"""A WebSocket round trip with `websockets` (>= 15) through Ostiary's CONNECT proxy.

usage: py_ws.py URL [MESSAGE] [-H NAME:VALUE]...

`websockets` is the library chosen because its client speaks HTTP CONNECT to a proxy and
sends the proxy URL's `user:token@` as Proxy-Authorization Basic, which is how agents
authenticate to Ostiary. The proxy is HTTPS_PROXY for wss:// (HTTP_PROXY for ws://), none
when unset; the CA bundle is REQUESTS_CA_BUNDLE or SSL_CERT_FILE. Sends MESSAGE (default
"hello ostiary") and prints {"sent", "echo"}. A failed connection or handshake (a proxy
407/403 included) prints {"error": "<class>: <message>"} and exits 3.
"""

import argparse
import asyncio
import ssl
import sys

from _common import ca_bundle, emit, fail, headers_from, proxy_for


async def round_trip(url, message, headers, timeout):
    from websockets.asyncio.client import connect

    kwargs = {}
    if url.startswith("wss:"):
        bundle = ca_bundle()
        kwargs["ssl"] = ssl.create_default_context(cafile=bundle) if bundle else True
    async with connect(
        url,
        proxy=proxy_for(url),
        additional_headers=headers,
        open_timeout=timeout,
        close_timeout=timeout,
        **kwargs,
    ) as ws:
        await ws.send(message)
        echo = await asyncio.wait_for(ws.recv(), timeout)
    return echo


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("url")
    ap.add_argument("message", nargs="?", default="hello ostiary")
    ap.add_argument("-H", "--header", action="append", default=[], metavar="NAME:VALUE")
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()
    try:
        echo = asyncio.run(
            round_trip(args.url, args.message, headers_from(args.header), args.timeout)
        )
    except Exception as exc:  # any failure to connect, handshake or echo is the result
        return fail(exc)
    if isinstance(echo, bytes):
        echo = echo.decode("utf-8", "replace")
    emit({"sent": args.message, "echo": echo})
    return 0


if __name__ == "__main__":
    sys.exit(main())
