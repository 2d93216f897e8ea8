#!/usr/bin/env python3
"""A reflecting HTTPS upstream that echoes the credential it received in the encodings real
encoders produce: Python's own (json.dumps, html.escape, urllib.parse.quote, quote_plus,
binascii, base64), and hand-written ones with the documented escaping rules of encoders
Python has not (.NET System.Text.Json, Go encoding/json, Gson, PHP json_encode and
htmlspecialchars), nested ones, and random per-character mixtures.

usage: encoding_upstream.py PORT CERT_CHAIN_PEM KEY_PEM

The echoed value is the request's `X-Api-Key` header (what the proxy injected). Routes:

- `GET|POST /echo?enc=NAME[&chunk=N][&sse=1][&trailers=1]`: a document of NAME's kind
  (JSON, HTML, text) holding the encoded value, also in the `X-Echo` header; in chunks of
  N bytes, as SSE events, or with the value again in an HTTP/1.1 trailer.
- `GET /echo?name=1`: the value percent-encoded into a response header's name; `GET
  /echo?enc=NAME&te=gzip`: the document gzipped as a transfer coding (`Transfer-Encoding:
  gzip, chunked`).
- `POST /idem?enc=NAME`: the same echo, answered 201 (an endpoint retried with
  `Idempotency-Key`).
- `POST /mcp` (JSON-RPC; the encoding in the `X-Enc` request header, `X-As: sse` for an
  SSE answer): `tools/list` lists `echo`, `listed` and `uncatalogued`, each description
  holding the value; `tools/call` answers with the value as text; batches get arrays.
- `POST /stream-echo`: answers at once, then writes back every chunk of the request body
  as it arrives (full duplex), to observe what a proxy holds back.

Letters, digits and `-_.` are never escaped, as no standard encoder escapes them (RFC
3986's unreserved characters; JSON and HTML encoders leave them alone too).

Exits 4 if the port is taken.
"""

import base64
import binascii
import email.base64mime
import errno
import gzip
import html
import html.entities
import json
import quopri
import random
import socket
import ssl
import sys
import textwrap
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def json_doc(value, escape=None, upper=False, slashes=False, ensure_ascii=True):
    """`{"echo": value}` from json.dumps, then `escape` characters written as \\uXXXX."""
    text = json.dumps({"echo": value}, ensure_ascii=ensure_ascii, separators=(",", ":"))
    return json_escape(text, escape or "", upper, slashes)


def json_escape(text, chars, upper=False, slashes=False):
    """Post-process json.dumps output the way another encoder writes: each of `chars` as
    \\uXXXX (only string contents hold them here), `/` as `\\/` with `slashes`."""
    for ch in chars:
        code = "\\u%04X" % ord(ch) if upper else "\\u%04x" % ord(ch)
        if ch == '"':
            text = text.replace('\\"', code)
        else:
            text = text.replace(ch, code)
    if slashes:
        text = text.replace("/", "\\/")
    return text


# .NET's JavaScriptEncoder.Default escapes HTML-sensitive characters, `+` and `` ` ``
# (uppercase hex); Go's encoding/json `<`, `>`, `&`; Gson `<`, `>`, `&`, `=`, `'`.
DOTNET = "+<>&'`\""
GO = "<>&"
GSON = "<>&='"

NAMES = {}
for _name, _char in sorted(html.entities.html5.items()):
    if _name.endswith(";") and len(_char) == 1:
        NAMES.setdefault(_char, _name)


def plain(c):
    """Characters no standard encoder escapes."""
    return c.isascii() and (c.isalnum() or c in "-_.")


def html_named(value):
    """Every special character by its HTML5 name (Python's own table)."""
    return "".join("&" + NAMES[c] if not plain(c) and c in NAMES else c for c in value)


def every_special(value, fmt):
    return "".join(c if plain(c) else fmt(c) for c in value)


def mixed(value, seed):
    """Each special character independently raw or in one of many spellings."""
    rng = random.Random(seed)
    out = []
    for c in value:
        if plain(c):
            out.append(c)
            continue
        n = ord(c)
        spellings = [
            c, "\\u%04x" % n, "\\u%04X" % n, "&#%d;" % n, "&#0%d;" % n, "&#x%x;" % n,
            "&#X%X;" % n, "%%%02X" % n, "%%%02x" % n, "\\u0026#%d;" % n, "%%25%02X" % n,
            "\\\\u%04X" % n,
        ]
        if c in NAMES:
            spellings.append("&" + NAMES[c])
        if c == " ":
            spellings.append("+")
        out.append(rng.choice(spellings))
    return "".join(out)


def text(body):
    return ("text/plain", body)


def page(body):
    return ("text/html", "<html><body><p>" + body + "</p></body></html>")


def jsonc(body):
    return ("application/json", body)


def encoders():
    q = urllib.parse.quote
    qp = urllib.parse.quote_plus
    b64 = lambda v: base64.b64encode(v.encode()).decode()
    enc = {
        "raw": lambda v: text(v),
        "json_ascii": lambda v: jsonc(json_doc(v)),
        "json_utf8": lambda v: jsonc(json_doc(v, ensure_ascii=False)),
        "json_dotnet": lambda v: jsonc(json_doc(v, DOTNET, upper=True)),
        "json_go": lambda v: jsonc(json_doc(v, GO)),
        "json_gson": lambda v: jsonc(json_doc(v, GSON)),
        "json_php": lambda v: jsonc(json_doc(v, slashes=True)),
        "json_every": lambda v: jsonc(
            json.dumps({"echo": every_special(v, lambda c: "\\u%04x" % ord(c))})
            .replace("\\\\u", "\\u")),
        "json_in_json": lambda v: jsonc(json.dumps({"doc": json_doc(v, DOTNET, upper=True)})),
        "html_escape": lambda v: page(html.escape(v, quote=True)),
        "html_php": lambda v: page(html.escape(v, quote=True).replace("&#x27;", "&#039;")),
        "html_decimal": lambda v: page(every_special(v, lambda c: "&#%d;" % ord(c))),
        "html_hex_upper": lambda v: page(every_special(v, lambda c: "&#X%X;" % ord(c))),
        "html_named": lambda v: page(html_named(v)),
        "html_twice": lambda v: page(html.escape(html.escape(v))),
        "url_quote": lambda v: text("https://cb.example.test/?t=" + q(v, safe="")),
        "url_quote_lower": lambda v: text(
            "https://cb.example.test/?t=" + "".join(
                p.lower() if p.startswith("%") else p for p in _split_pct(q(v, safe="")))),
        "url_quote_plus": lambda v: text("t=" + qp(v) + "&x=1"),
        "url_twice": lambda v: text("https://cb.example.test/?u=" + q(q(v, safe=""), safe="")),
        "url_in_json_php": lambda v: jsonc(json_doc("https://cb.example.test/?t=" + qp(v),
                                                    slashes=True)),
        "url_in_json_dotnet": lambda v: jsonc(json_doc("https://cb.example.test/?t=" + qp(v),
                                                       DOTNET, upper=True)),
        "html_in_json_go": lambda v: jsonc(json_doc(html.escape(v), GO)),
        "json_in_html": lambda v: page(html.escape(json_doc(v, GO))),
        "hex": lambda v: text(binascii.hexlify(v.encode()).decode()),
        "hex_upper": lambda v: text(binascii.hexlify(v.encode()).decode().upper()),
        "base64_gson": lambda v: jsonc(json_doc(b64(v), GSON)),
        "base64_php": lambda v: jsonc(json_doc(b64(v), slashes=True)),
        "base64_query": lambda v: text("t=" + q(b64(v), safe="")),
        # Wrapping encoders: the value's encoding cut across lines wherever the column
        # count falls (the prefix moves the cut), as mail and key files carry it.
        "mime_base64": lambda v: text(base64.encodebytes(wrapped(v).encode()).decode()),
        "mime_crlf": lambda v: text(email.base64mime.body_encode(
            wrapped(v).encode(), maxlinelen=76, eol="\r\n")),
        "pem": lambda v: text(ssl.DER_cert_to_PEM_cert(wrapped(v).encode())),
        "pem_in_json": lambda v: jsonc(json.dumps(
            {"pem": ssl.DER_cert_to_PEM_cert(wrapped(v).encode())})),
        "quoted_printable": lambda v: text(quopri.encodestring(wrapped(v).encode()).decode()),
        "hex_wrapped": lambda v: text("\n".join(textwrap.wrap(
            binascii.hexlify(wrapped(v).encode()).decode(), 64))),
    }
    for seed in range(8):
        enc["mixed_%d" % seed] = (lambda s: lambda v: page(mixed(v, s)))(seed)
    return enc


def wrapped(value):
    """The value in a longer text that puts it across a line break of a 76-column wrap."""
    return "Authorization: Bearer " + "x" * 23 + value + " (logged)"


def _split_pct(s):
    out, i = [], 0
    while i < len(s):
        if s[i] == "%":
            out.append(s[i:i + 3])
            i += 3
        else:
            out.append(s[i])
            i += 1
    return out


ENCODERS = encoders()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def secret(self):
        return self.headers.get("X-Api-Key", "")

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                chunk = self.read_chunk()
                if chunk is None:
                    return data
                data += chunk
        n = int(self.headers.get("Content-Length", "0") or 0)
        return self.rfile.read(n) if n else b""

    def read_chunk(self):
        """The next chunk of a chunked request body; None at its end."""
        line = self.rfile.readline()
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return None
        data = self.rfile.read(size)
        self.rfile.readline()
        return data

    def send_chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        self.route()

    def do_POST(self):
        self.route()

    def route(self):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/stream-echo":
            return self.stream_echo()
        body = self.read_body()
        if url.path == "/mcp":
            return self.mcp(body)
        if url.path in ("/echo", "/idem"):
            status = 201 if url.path == "/idem" else 200
            return self.echo(query, status)
        self.answer(404, "text/plain", b"not found\n")

    def echo(self, query, status):
        if query.get("name"):
            # The value in a header *name* (percent-encoded: a name is a token), in the
            # case it was sent in.
            named = "X-N-" + urllib.parse.quote(self.secret(), safe="")
            return self.answer(status, "text/plain", b"ok\n", {named: "1"})
        name = query.get("enc", "raw")
        ctype, doc = ENCODERS[name](self.secret())
        if query.get("te"):
            # A transfer coding other than chunked, which HTTP/1.1 clients take off.
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Transfer-Encoding", "gzip, chunked")
            self.end_headers()
            self.send_chunk(gzip.compress(doc.encode()))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        # The header carries the document's own spelling of the value when it is one line.
        header = doc if len(doc) < 4000 and "\n" not in doc else ""
        if query.get("sse"):
            events = "".join("event: echo\ndata: %s\n\n" % line for line in doc.split("\n"))
            return self.chunked(status, "text/event-stream", events.encode(),
                                int(query.get("chunk", "7")), header)
        if query.get("chunk") or query.get("trailers"):
            return self.chunked(status, ctype, doc.encode(), int(query.get("chunk", "5")),
                                header, trailer=doc if query.get("trailers") else None)
        self.answer(status, ctype, doc.encode(), {"X-Echo": header} if header else {})

    def answer(self, status, ctype, body, headers=None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def chunked(self, status, ctype, body, size, header, trailer=None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        if header:
            self.send_header("X-Echo", header)
        if trailer is not None:
            self.send_header("Trailer", "X-Echo-Trailer")
        self.end_headers()
        for at in range(0, len(body), size):
            self.send_chunk(body[at:at + size])
        if trailer is not None:
            self.wfile.write(b"0\r\nX-Echo-Trailer: %s\r\n\r\n" % trailer.encode())
        else:
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def mcp(self, body):
        name = self.headers.get("X-Enc", "raw")
        value = self.secret()
        try:
            request = json.loads(body)
        except ValueError:
            return self.answer(400, "text/plain", b"bad json\n")
        batch = isinstance(request, list)
        answers = [a for a in (self.rpc(m, value) for m in (request if batch else [request]))
                   if a is not None]
        if not answers:
            return self.answer(202, "text/plain", b"")
        doc = json.dumps(answers if batch else answers[0], separators=(",", ":"))
        doc = reencode(doc, name)
        if self.headers.get("X-As") == "sse":
            events = 'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress",' \
                     '"params":{"progress":1}}\n\nevent: message\ndata: %s\n\n' % doc
            return self.chunked(200, "text/event-stream", events.encode(), 9, "")
        self.answer(200, "application/json", doc.encode())

    def rpc(self, message, value):
        if "id" not in message:
            return None
        method = message.get("method")
        if method == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "enc", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [
                {"name": n, "description": "uses " + value, "inputSchema": {"type": "object"}}
                for n in ("echo", "listed", "uncatalogued")]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": "saw " + value}], "isError": False}
        else:
            return {"jsonrpc": "2.0", "id": message["id"],
                    "error": {"code": -32601, "message": "no " + str(method)}}
        return {"jsonrpc": "2.0", "id": message["id"], "result": result}

    def stream_echo(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        while True:
            chunk = self.read_chunk()
            if chunk is None:
                break
            if chunk:
                self.send_chunk(chunk)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def reencode(doc, name):
    """A JSON-RPC document re-spelled the way encoder `name` would have written it."""
    if name == "dotnet":
        return json_escape(doc, DOTNET, upper=True)
    if name == "go":
        return json_escape(doc, GO)
    if name == "gson":
        return json_escape(doc, GSON)
    if name == "php":
        return json_escape(doc, "", slashes=True)
    return doc


def main():
    port, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return 4
        raise
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["http/1.1"])
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print("ready", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
