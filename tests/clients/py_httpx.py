#!/usr/bin/env python3
"""One HTTP request with `httpx` (>= 0.28), as an agent would make it through Ostiary.

usage: py_httpx.py URL [METHOD] [BODY] [-H NAME:VALUE]...

The proxy is HTTPS_PROXY for https:// URLs (HTTP_PROXY for http://), passed explicitly as
`httpx.Client(proxy=...)`; the CA bundle is REQUESTS_CA_BUNDLE or SSL_CERT_FILE, passed as
an SSLContext (httpx 0.28 deprecated `verify=<path>`; this is its replacement). With
OSTIARY_HTTP2=1 the client offers h2 (needs `httpx[http2]`). Prints {"status", "headers",
"body", "http_version"}; any HTTP status exits 0. A failed connection prints
{"error": "<class>: <message>"} and exits 3.
"""

import sys

from _common import emit, fail, headers_from, httpx_client, lower_headers, parse_args


def main():
    args = parse_args(__doc__)
    import httpx

    try:
        with httpx_client(args.url, args.timeout, follow_redirects=False) as client:
            response = client.request(
                args.method.upper(),
                args.url,
                content=None if args.body is None else args.body.encode("utf-8"),
                headers=headers_from(args.header),
            )
    except httpx.HTTPError as exc:
        return fail(exc)
    emit({
        "status": response.status_code,
        "headers": lower_headers(response.headers.multi_items()),
        "body": response.content.decode("utf-8", "replace"),
        "http_version": response.http_version,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
