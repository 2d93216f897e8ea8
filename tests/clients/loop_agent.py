#!/usr/bin/env python3
"""A stuck agent: the same call, COUNT times in a row, with `requests` through Ostiary.

usage: loop_agent.py COUNT URL [METHOD] [BODY] [-H NAME:VALUE]...

Agents that loop do not notice they loop: this one sends the identical request (same
method, URL and body) COUNT times on one `requests.Session`, as an agent runtime's tool
executor would, and does not stop on an error answer. Proxies come from HTTPS_PROXY (with
the session token as basic auth on CONNECT), the CA bundle from REQUESTS_CA_BUNDLE or
SSL_CERT_FILE.

Prints one JSON line: {"statuses": [...], "request_ids": [...], "first": {"<status>":
{"body", "headers"}}, "errors": [...]} -- one status and one `Ostiary-Request-Id` (null
when absent) per call, and the first answer of each distinct status (body parsed as JSON
when it is JSON). A proxy that refuses the tunnel itself (CONNECT
answered 407, 403, ...) reaches `requests` as an exception, not a response: its status is
taken from the exception's message ("Tunnel connection failed: 407 ...") and the message
kept in "errors". Any other connection failure prints {"error": ...} and exits 3.
"""

import argparse
import json
import re
import sys

from _common import ca_bundle, emit, fail, headers_from, lower_headers

TUNNEL_REFUSED = re.compile(r"Tunnel connection failed: (\d{3})")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("count", type=int)
    ap.add_argument("url")
    ap.add_argument("method", nargs="?", default="GET")
    ap.add_argument("body", nargs="?", default=None, help="request body (UTF-8 text)")
    ap.add_argument("-H", "--header", action="append", default=[], metavar="NAME:VALUE")
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()
    import requests

    session = requests.Session()
    headers = headers_from(args.header)
    if args.body is not None:
        headers.setdefault("Content-Type", "application/json")
    statuses, request_ids, first, errors = [], [], {}, []
    for _ in range(args.count):
        try:
            response = session.request(
                args.method.upper(),
                args.url,
                data=None if args.body is None else args.body.encode("utf-8"),
                headers=headers,
                verify=ca_bundle() or True,
                timeout=args.timeout,
                allow_redirects=False,
            )
        except requests.exceptions.ProxyError as exc:
            refused = TUNNEL_REFUSED.search(str(exc))
            if not refused:
                return fail(exc)
            status = int(refused.group(1))
            statuses.append(status)
            request_ids.append(None)
            errors.append(f"{type(exc).__name__}: {exc}")
            first.setdefault(str(status), {"body": None, "headers": {}})
            # A refused tunnel leaves no connection to reuse; the next call opens another.
            session.close()
            continue
        except requests.exceptions.RequestException as exc:
            return fail(exc)
        statuses.append(response.status_code)
        request_ids.append(response.headers.get("Ostiary-Request-Id"))
        if str(response.status_code) not in first:
            text = response.content.decode("utf-8", "replace")
            try:
                body = json.loads(text)
            except ValueError:
                body = text
            first[str(response.status_code)] = {
                "body": body,
                "headers": lower_headers(response.headers.items()),
            }
    emit({"statuses": statuses, "request_ids": request_ids, "first": first, "errors": errors})
    return 0


if __name__ == "__main__":
    sys.exit(main())
