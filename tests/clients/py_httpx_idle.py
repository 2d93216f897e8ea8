#!/usr/bin/env python3
"""Two GETs of URL on one `httpx` client, PAUSE seconds apart: an agent that keeps its client
between a model's turns, through Ostiary.

usage: py_httpx_idle.py URL PAUSE

Proxy and CA as py_httpx.py (HTTPS_PROXY, REQUESTS_CA_BUNDLE or SSL_CERT_FILE); with
OSTIARY_HTTP2=1 the client offers h2. Prints {"statuses", "http_versions", "stream_ids"} of
the two (an h2 stream id of 1 is a connection's first request: the second request on a new
connection has 1 again, on the same one 3); a failed request prints
{"error": "<class>: <message>"} and exits 3.
"""

import argparse
import sys
import time

from _common import emit, fail, httpx_client


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("url")
    ap.add_argument("pause", type=float)
    args = ap.parse_args()
    import httpx

    statuses, versions, streams = [], [], []
    try:
        with httpx_client(args.url, 30) as client:
            for i in range(2):
                if i:
                    time.sleep(args.pause)
                response = client.get(args.url)
                statuses.append(response.status_code)
                versions.append(response.http_version)
                streams.append(response.extensions.get("stream_id"))
    except httpx.HTTPError as exc:
        return fail(exc)
    emit({"statuses": statuses, "http_versions": versions, "stream_ids": streams})
    return 0


if __name__ == "__main__":
    sys.exit(main())
