#!/usr/bin/env python3
"""A lenient HTTPS upstream: decodes JSON case-insensitively and routes paths loosely, the way
Go's encoding/json, servlet containers and nginx do, and records everything it receives.

usage: lenient_upstream.py PORT CERT_CHAIN_PEM KEY_PEM LOG_JSONL

Serves 127.0.0.1:PORT. Every request whose body arrives whole is appended to LOG_JSONL as one JSON line
{"method", "path", "routed", "body", "decoded"} before it is answered, so a test can prove
what reached it. Decoding: object keys are folded to lower case and, of keys equal ignoring
case (or given twice), the last one wins — what Go's encoding/json does when it fills a struct.
Routing: `;parameters` are cut from segments, slashes merged, `%2F` taken as `/`, a trailing
slash dropped. The answer is 200 with {"routed": ..., "decoded": ...} (for a JSON-RPC body,
a JSON-RPC result carrying the same), so the test also sees how the upstream read it.
Exits 4 if the port is taken.
"""

import errno
import json
import re
import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def fold_pairs(pairs):
    out = {}
    for key, value in pairs:
        out[key.casefold()] = value  # the last of keys equal ignoring case wins
    return out


def lenient_decode(body):
    try:
        return json.loads(body, object_pairs_hook=fold_pairs)
    except ValueError:
        return None


def lenient_route(path):
    path = re.sub(r"%2[fF]|%5[cC]|\\", "/", path.split("?", 1)[0])
    segments = [s.split(";", 1)[0] for s in path.split("/")]
    return "/" + "/".join(s for s in segments if s)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_lock = threading.Lock()

    def log_message(self, *args):
        pass

    def handle_any(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if len(raw) < length:
            # The body ended before its length: no server runs a handler for that (Rack,
            # PHP and the rest fail the request), so nothing is run or recorded.
            self.close_connection = True
            return
        body = raw.decode("utf-8", "replace")
        decoded = lenient_decode(body) if body else None
        routed = lenient_route(self.path)
        with self.log_lock, open(self.server.log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps({
                "method": self.command, "path": self.path, "routed": routed,
                "body": body, "decoded": decoded,
            }) + "\n")
        seen = {"routed": routed, "method": self.command, "decoded": decoded}
        if isinstance(decoded, dict) and decoded.get("jsonrpc") == "2.0":
            answer = {"jsonrpc": "2.0", "id": decoded.get("id"), "result": seen}
        else:
            answer = seen
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # Methods in any case are the method: a lenient server takes `post` for POST.
    def __getattr__(self, name):
        if name.startswith("do_"):
            return self.handle_any
        raise AttributeError(name)


def main():
    port, cert, key, log_path = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return 4
        raise
    server.log_path = log_path
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print("ready", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
