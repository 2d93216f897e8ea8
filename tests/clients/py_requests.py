#!/usr/bin/env python3
"""One HTTP request with `requests`, as an agent would make it through Ostiary.

usage: py_requests.py URL [METHOD] [BODY] [-H NAME:VALUE]...

Proxies come from HTTPS_PROXY/HTTP_PROXY (requests reads them itself, including the
`user:token@` basic auth it sends with CONNECT); the CA bundle from REQUESTS_CA_BUNDLE or
SSL_CERT_FILE. Prints {"status", "headers", "body", "http_version"}; any HTTP status
exits 0. A failed connection prints {"error": "<class>: <message>"} and exits 3.
"""

import sys

from _common import ca_bundle, emit, fail, headers_from, lower_headers, parse_args


def main():
    args = parse_args(__doc__)
    import requests

    session = requests.Session()
    try:
        response = session.request(
            args.method.upper(),
            args.url,
            data=None if args.body is None else args.body.encode("utf-8"),
            headers=headers_from(args.header),
            verify=ca_bundle() or True,
            timeout=args.timeout,
            # A redirect is an answer the test wants to see, not follow.
            allow_redirects=False,
        )
    except requests.exceptions.RequestException as exc:
        return fail(exc)
    version = {10: "HTTP/1.0", 11: "HTTP/1.1", 20: "HTTP/2"}.get(
        getattr(response.raw, "version", 11), "HTTP/1.1"
    )
    emit({
        "status": response.status_code,
        "headers": lower_headers(response.headers.items()),
        "body": response.content.decode("utf-8", "replace"),
        "http_version": version,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
