#!/usr/bin/env python3
"""Where a secret hides in bytes, found with real decoders: the test oracle for scrubbing.

usage: find_secret.py < {"secrets": [...], "haystacks": [{"what": ..., "b64": ...}, ...]}

Every haystack is decoded through every sequence of up to three of Python's own decoders
— html.unescape, urllib.parse.unquote, unquote_plus, JSON string unescaping (json.loads
of each escape run), quopri (quoted-printable) and line unwrapping (every line break taken
out, as a MIME or PEM reader joins the lines of a base64 body) — and each view is searched for each secret raw, in hex (either case)
and in base64/base64url (whole, padded or not, and the characters any larger blob holding
it at one of the three byte alignments must contain). Prints one JSON line: the list of
findings, each naming the haystack, the decoders and the form (never the secret itself).
"""

import base64
import binascii
import html
import itertools
import json
import quopri
import re
import sys
import urllib.parse

JSON_ESCAPES = re.compile(r'(?:\\u[0-9a-fA-F]{4})+|\\["\\/bfnrt]')


def json_unescape(text):
    def one(m):
        try:
            return json.loads('"' + m.group(0) + '"')
        except ValueError:
            return m.group(0)
    return JSON_ESCAPES.sub(one, text)


DECODERS = {
    "html": html.unescape,
    "url": lambda t: urllib.parse.unquote(t, errors="surrogateescape"),
    "form": lambda t: urllib.parse.unquote_plus(t, errors="surrogateescape"),
    "json": json_unescape,
    "qp": lambda t: quopri.decodestring(t.encode("utf-8", "surrogateescape")).decode(
        "utf-8", "surrogateescape"),
    "lines": lambda t: t.replace("\r", "").replace("\n", ""),
}


def forms(secret):
    raw = secret.encode("utf-8", "surrogateescape")
    out = {"raw": secret, "hex": binascii.hexlify(raw).decode()}
    out["HEX"] = out["hex"].upper()
    for name, enc in (("b64", base64.b64encode), ("b64url", base64.urlsafe_b64encode)):
        whole = enc(raw).decode()
        out[name] = whole
        out[name + " unpadded"] = whole.rstrip("=")
        for shift in range(3):
            blob = enc(b"\0" * shift + raw).decode().rstrip("=")
            start = -(-8 * shift // 6)
            end = (8 * (shift + len(raw))) // 6
            out["%s at %d" % (name, shift)] = blob[start:end]
    return out


def views(text, depth=3):
    seen = {(): text}
    frontier = [((), text)]
    for _ in range(depth):
        nxt = []
        for path, t in frontier:
            for name, dec in DECODERS.items():
                try:
                    v = dec(t)
                except Exception:
                    continue
                if v != t and v not in seen.values():
                    seen[path + (name,)] = v
                    nxt.append((path + (name,), v))
        frontier = nxt
    return seen


def main():
    job = json.load(sys.stdin)
    findings = []
    all_forms = [(i, forms(s)) for i, s in enumerate(job["secrets"])]
    for hay in job["haystacks"]:
        text = base64.b64decode(hay["b64"]).decode("utf-8", "surrogateescape")
        for path, view in views(text).items():
            for i, fs in all_forms:
                for form, needle in fs.items():
                    if needle and needle in view:
                        findings.append("%s: secret %d as %s after %s" % (
                            hay["what"], i, form, "+".join(path) or "no decoding"))
    print(json.dumps(findings))


if __name__ == "__main__":
    main()
