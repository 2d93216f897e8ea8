"""An upstream whose event stream comes as it happens: for every request on a keep-alive
HTTPS connection, the head and the first event at once, then the rest of `--events` events
`--gap-ms` apart (chunked `text/event-stream`). nginx serving a file sends a whole stream in
one burst onto the cores the proxy runs on; this one does not, so the first byte it gives
the `sse-live` scenario is what the relay's own path adds.

    python live_events.py --port P --cert C --key K [--events 8] [--gap-ms 2]
"""
from __future__ import annotations

import argparse
import asyncio
import ssl

EVENT = b"data: " + b"e" * 1016 + b"\n\n"
CHUNK = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        b"transfer-encoding: chunked\r\n\r\n")


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, events: int,
                gap: float):
    try:
        while True:
            await reader.readuntil(b"\r\n\r\n")  # GET: no body
            writer.write(HEAD + CHUNK)
            await writer.drain()
            for _ in range(events - 1):
                await asyncio.sleep(gap)
                writer.write(CHUNK)
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--events", type=int, default=8)
    ap.add_argument("--gap-ms", type=float, default=2.0)
    opts = ap.parse_args()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(opts.cert, opts.key)
    ctx.set_alpn_protocols(["http/1.1"])
    server = await asyncio.start_server(
        lambda r, w: serve(r, w, opts.events, opts.gap_ms / 1e3), "127.0.0.1", opts.port,
        ssl=ctx)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
