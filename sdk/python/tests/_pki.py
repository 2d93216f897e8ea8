"""A test CA and a server certificate it signed, made with the ``openssl`` command line.

The upstreams serve TLS under made-up names (``api.example.test``) that the proxy resolves to
127.0.0.1; the proxy trusts this CA (``egress.ca_file``), the agent trusts only Ostiary's.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path
    chain: Path
    key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    done = subprocess.run(
        ["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(map(str, args))} failed:\n{done.stderr}")


def make_certs(dir: Path, names: list[str]) -> Certs:
    """A CA, and a leaf for ``names`` (EC P-256, one day) with the chain leaf + CA."""
    dir.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
        "-subj", "/CN=ostiary sdk test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=dir,
    )
    _openssl(
        "req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={names[0]}",
        cwd=dir,
    )
    san = ",".join(f"DNS:{n}" for n in names)
    (dir / "ext.cnf").write_text(
        f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf",
        cwd=dir,
    )
    chain = dir / "chain.pem"
    chain.write_text((dir / "server.pem").read_text() + (dir / "ca.pem").read_text())
    return Certs(ca=dir / "ca.pem", chain=chain, key=dir / "server.key")
