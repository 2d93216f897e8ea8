"""Shared bits of the Python test clients: argv, proxy and CA lookup, one-line JSON output.

The clients behave like an agent runtime would: proxies and the CA bundle come from the
environment that `ostiary session new` exports, and the result is one JSON line on stdout
so the Rust tests can assert on it without parsing prose.
"""

import argparse
import json
import os
import sys

# Exit code for "the connection itself failed" (DNS, TCP, TLS, proxy refusal, timeout),
# as opposed to any HTTP status, which is a successful exchange.
EXIT_CONNECTION_FAILED = 3


def parse_args(description):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("url")
    ap.add_argument("method", nargs="?", default="GET")
    ap.add_argument("body", nargs="?", default=None, help="request body (UTF-8 text)")
    ap.add_argument(
        "-H", "--header", action="append", default=[], metavar="NAME:VALUE",
        help="extra request header; repeatable",
    )
    ap.add_argument("--timeout", type=float, default=60.0)
    return ap.parse_args()


def headers_from(pairs):
    headers = {}
    for pair in pairs:
        name, sep, value = pair.partition(":")
        if not sep:
            raise SystemExit(f"bad header {pair!r}: expected NAME:VALUE")
        headers[name.strip()] = value.strip()
    return headers


def proxy_for(url):
    """The proxy URL for `url` from the environment, or None to connect directly."""
    scheme = url.split(":", 1)[0].lower()
    names = {
        "https": ["HTTPS_PROXY", "https_proxy"],
        "wss": ["HTTPS_PROXY", "https_proxy"],
        "http": ["HTTP_PROXY", "http_proxy"],
        "ws": ["HTTP_PROXY", "http_proxy"],
    }.get(scheme, [])
    for name in names + ["ALL_PROXY", "all_proxy"]:
        value = os.environ.get(name)
        if value:
            return value
    return None


def ca_bundle():
    """The CA bundle path from REQUESTS_CA_BUNDLE or SSL_CERT_FILE, or None for the defaults."""
    for name in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(name)
        if value:
            return value
    return None


def httpx_client(url, timeout, **options):
    """An `httpx.Client` as an agent would build it for `url`: the proxy and CA above, h2
    offered with OSTIARY_HTTP2=1 (needs `httpx[http2]`), and nothing else from the
    environment (`trust_env=False`), so what a test set is what the client used. The CA goes
    in as an SSLContext: httpx 0.28 deprecated `verify=<path>`."""
    import ssl

    import httpx

    bundle = ca_bundle()
    return httpx.Client(
        proxy=proxy_for(url),
        verify=ssl.create_default_context(cafile=bundle) if bundle else True,
        http2=os.environ.get("OSTIARY_HTTP2") == "1",
        trust_env=False,
        timeout=timeout,
        **options,
    )


def lower_headers(items):
    """Lowercased header names; repeated headers joined with ", " as HTTP allows."""
    out = {}
    for name, value in items:
        key = name.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def fail(exc):
    # An ExceptionGroup (anyio task groups) says nothing by itself: name what is inside.
    def leaves(e):
        inner = getattr(e, "exceptions", None)
        return [x for i in inner for x in leaves(i)] if inner else [e]

    found = leaves(exc)
    detail = "; ".join(f"{type(e).__name__}: {e}" for e in found) if found != [exc] else ""
    emit({"error": f"{type(exc).__name__}: {exc}" + (f" [{detail}]" if detail else "")})
    return EXIT_CONNECTION_FAILED
