"""What the load harness measures and how it asks: the local upstream (nginx), each proxy
started on its own loopback port (Ostiary's ladder of configurations, the relay rung,
hudsucker, squid with ssl-bump, mitmdump), the scenarios and one `oha` run of a scenario
against a setup, with the proxy's CPU and RSS read from /proc.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benches" / "results"
HOST = "localhost"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, what: str, proc: subprocess.Popen | None = None, timeout: float = 30,
              log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            said = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening\n{said}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout}s")


def run(cmd: list[str], **kw) -> str:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)
    return out.stdout


# --- certificates -------------------------------------------------------------------------


def make_certs(work: Path) -> dict[str, Path]:
    """An upstream CA and nginx's leaf for localhost; a MITM CA for squid and hudsucker."""
    p = {
        "up_ca": work / "upstream-ca.pem",
        "up_ca_key": work / "upstream-ca.key",
        "up_cert": work / "upstream.pem",
        "up_key": work / "upstream.key",
        "mitm_ca": work / "mitm-ca.pem",
        "mitm_key": work / "mitm-ca.key",
        "mitm_both": work / "mitm-ca-both.pem",
    }
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca, key, cn in (("up_ca", "up_ca_key", "bench upstream CA"), ("mitm_ca", "mitm_key", "bench MITM CA")):
        run(["openssl", "req", "-x509", *ec, "-keyout", str(p[key]), "-out", str(p[ca]),
             "-days", "30", "-subj", f"/CN={cn}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
    csr = work / "upstream.csr"
    run(["openssl", "req", *ec, "-keyout", str(p["up_key"]), "-out", str(csr), "-subj", f"/CN={HOST}"])
    ext = work / "upstream.ext"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(p["up_ca"]), "-CAkey", str(p["up_ca_key"]),
         "-CAcreateserial", "-out", str(p["up_cert"]), "-days", "30", "-extfile", str(ext)])
    # mitmproxy wants its CA as one PEM with the key first; squid takes cert+key in one file.
    p["mitm_both"].write_text(p["mitm_key"].read_text() + p["mitm_ca"].read_text())
    return p


# --- the upstream -------------------------------------------------------------------------


def start_nginx(work: Path, certs: dict[str, Path], port: int) -> subprocess.Popen:
    root = work / "www"
    (root / "tool").mkdir(parents=True)
    kib = b"x" * 1023 + b"\n"
    mib = (b"y" * 1023 + b"\n") * 1024
    # An event stream: 1,024 events of 1 KiB (time to first byte, and streaming rate).
    events = (b"data: " + b"e" * 1016 + b"\n\n") * 1024
    for base in (root, root / "tool"):
        (base / "1k").write_bytes(kib)
        (base / "1m").write_bytes(mib)
        (base / "events").write_bytes(events)
        # 16 MiB: RSS while streaming must not grow with the body.
        (base / "16m").write_bytes(mib * 16)
    conf = work / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    default_type application/octet-stream;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    client_body_temp_path {work}/nginx-body;
    proxy_temp_path {work}/nginx-proxy;
    fastcgi_temp_path {work}/nginx-fcgi;
    uwsgi_temp_path {work}/nginx-uwsgi;
    scgi_temp_path {work}/nginx-scgi;
    server {{
        listen 127.0.0.1:{port} ssl http2;
        listen [::1]:{port} ssl http2;
        ssl_certificate {certs['up_cert']};
        ssl_certificate_key {certs['up_key']};
        ssl_session_cache shared:SSL:10m;
        root {root};
        location ~ /events$ {{ default_type text/event-stream; }}
    }}
}}
""")
    proc = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(work)],
                            stdout=subprocess.DEVNULL, stderr=open(work / "nginx.out", "w"))
    wait_port(port, "nginx", proc)
    return proc


def start_live_events(certs: dict[str, Path], port: int) -> subprocess.Popen:
    """The `sse-live` scenario's upstream (`live_events.py`): events as they happen, not a
    file's burst."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("live_events.py")),
                             "--port", str(port), "--cert", str(certs["up_cert"]),
                             "--key", str(certs["up_key"])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, "live events", proc)
    return proc


# --- the setups ---------------------------------------------------------------------------


@dataclass
class Setup:
    name: str
    proxy: str | None  # proxy URL for oha's -x, None for direct
    path_prefix: str = ""  # Ostiary's tool rung asks for /tool/...
    proxy_header: str | None = None
    procs: list[subprocess.Popen] = field(default_factory=list)
    pid: int | None = None  # the process whose RSS is read

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


POLICIES = """
@id("bench-connect")
permit (principal, action == Ostiary::Action::"connect", resource == Ostiary::Host::"localhost");
@id("bench-http")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"localhost");
@id("bench-read")
permit (principal, action in Ostiary::Action::"tier:read", resource);
"""

TOOLS = "".join(f"""
[[tool]]
name  = "bench.read_{size}"
tier  = "read"
match = {{ host = "localhost", method = "GET", path = "/tool/{size}" }}
args_schema = {{ type = "object", properties = {{ q = {{ type = "string" }} }} }}
cost  = 0.0001
""" for size in ("1k", "1m", "16m", "events"))

# Rungs of Ostiary's ladder: each adds work to the one before.
RUNGS = {
    # CONNECT authenticated and decided (Action::"connect"), then bytes relayed uninspected.
    "ostiary-tunnel": dict(tunnel=True, inject=False, tool=False),
    # Intercepted: TLS terminated, every request authenticated, decided by Cedar, audited.
    "ostiary-http": dict(tunnel=False, inject=False, tool=False),
    # + a brokered credential injected into every request, responses scrubbed of it.
    "ostiary-inject": dict(tunnel=False, inject=True, tool=False),
    # + the request recognised as a catalogued read tool: args schema, limits, budget
    #   charge, the watchdog — the full pipeline of a tool call.
    "ostiary-tool": dict(tunnel=False, inject=True, tool=True),
}


def start_ostiary(work: Path, certs, up_port: int, name: str, rung: dict, binary: Path,
                  extra: str = "", extra_env: dict[str, str] | None = None) -> Setup:
    d = work / name
    (d / "policies").mkdir(parents=True)
    (d / "policies" / "bench.cedar").write_text(POLICIES)
    (d / "policies" / "tools.toml").write_text(TOOLS)
    (d / "secrets.toml").write_text('bench = "bench-secret-value-0123456789"\n')
    proxy_port, control_port = free_port(), free_port()
    tunnel = '["localhost"]' if rung["tunnel"] else "[]"
    cred = ""
    if rung["inject"]:
        cred = """
[[credential]]
name   = "bench"
source = { file = "bench" }
hosts  = ["localhost"]
inject = { header = "Authorization", value = "Bearer {secret}" }
"""
    # `listen.KEY = V` lines of `extra` belong in [listen], which this file opens itself.
    listen = "\n".join(line.removeprefix("listen.") for line in extra.splitlines()
                       if line.startswith("listen."))
    extra = "\n".join(line for line in extra.splitlines() if not line.startswith("listen."))
    (d / "ostiary.toml").write_text(f"""
[listen]
proxy = "127.0.0.1:{proxy_port}"
control = "127.0.0.1:{control_port}"
{listen}
[state]
dir = "{d}/state"
[policy]
dir = "{d}/policies"
watch_interval = "0s"
[egress]
ports = [{up_port}]
allow_private = ["127.0.0.1/32", "::1/128"]
resolve = {{ "localhost" = "127.0.0.1" }}
ca_file = "{certs['up_ca']}"
tunnel = {tunnel}
[broker]
backend = "file"
file = "{d}/secrets.toml"
[sessions]
default_ttl = "4h"
[sessions.watchdog]
cycle_repeats = 1000000
[tiers.read]
repeat_max = 0
{cred}
{extra}
""")
    env = dict(os.environ, OSTIARY_ADMIN_TOKEN=secrets.token_hex(32), RUST_LOG="warn",
               **(extra_env or {}))
    log = open(d / "ostiary.log", "w")
    proc = subprocess.Popen([str(binary), "serve", "--config", str(d / "ostiary.toml")],
                            env=env, stdout=log, stderr=log)
    wait_port(proxy_port, f"ostiary ({name})", proc, log=d / "ostiary.log")
    wait_port(control_port, f"ostiary control ({name})", proc)
    session = json.loads(run([str(binary), "session", "new", "--agent", "bench", "--ttl", "4h",
                              "--json", "--config", str(d / "ostiary.toml")], env=env))
    return Setup(name=name, proxy=f"http://127.0.0.1:{proxy_port}",
                 proxy_header=f"Proxy-Authorization: Bearer {session['token']}",
                 path_prefix="/tool" if rung["tool"] else "", procs=[proc], pid=proc.pid)


def start_relay(work: Path, certs, binary: Path, name: str) -> Setup:
    """A relay taking `ADDR CA_CERT CA_KEY UPSTREAM_ROOTS`: Ostiary's interception parts alone
    (benches/src/bin/relay.rs, the ladder's bottom rung) or the hudsucker one."""
    port = free_port()
    log = open(work / f"{name}.log", "w")
    proc = subprocess.Popen([str(binary), f"127.0.0.1:{port}", str(certs["mitm_ca"]),
                             str(certs["mitm_key"]), str(certs["up_ca"])], stdout=log, stderr=log)
    wait_port(port, name, proc)
    return Setup(name=name, proxy=f"http://127.0.0.1:{port}", procs=[proc], pid=proc.pid)


def start_squid(work: Path, certs) -> Setup:
    d = work / "squid"
    d.mkdir()
    port = free_port()
    db = d / "ssl_db"
    run(["/usr/lib/squid/security_file_certgen", "-c", "-s", str(db), "-M", "16MB"])
    shutil.chown(d, "proxy", "proxy")
    for path in db.rglob("*"):
        shutil.chown(path, "proxy", "proxy")
    shutil.chown(db, "proxy", "proxy")
    conf = d / "squid.conf"
    conf.write_text(f"""
http_port 127.0.0.1:{port} ssl-bump generate-host-certificates=on dynamic_cert_mem_cache_size=16MB tls-cert={certs['mitm_both']}
sslcrtd_program /usr/lib/squid/security_file_certgen -s {db} -M 16MB
sslcrtd_children 4 startup=1 idle=1
ssl_bump bump all
tls_outgoing_options cafile={certs['up_ca']}
http_access allow localhost
http_access deny all
acl SSL_ports port 1-65535
acl Safe_ports port 1-65535
cache deny all
access_log none
cache_store_log none
cache_log {d}/cache.log
pid_filename {d}/squid.pid
coredump_dir {d}
cache_effective_user proxy
shutdown_lifetime 0 seconds
workers 1
""")
    for path in (conf, certs["mitm_both"], certs["up_ca"]):
        os.chmod(path, 0o644)
    log = open(d / "squid.out", "w")
    proc = subprocess.Popen(["squid", "-N", "-f", str(conf)], stdout=log, stderr=log)
    wait_port(port, "squid", proc)
    return Setup(name="squid-bump", proxy=f"http://127.0.0.1:{port}", procs=[proc], pid=proc.pid)


def start_mitmdump(work: Path, certs, mitmdump: str) -> Setup:
    d = work / "mitm"
    d.mkdir()
    shutil.copy(certs["mitm_both"], d / "mitmproxy-ca.pem")
    port = free_port()
    log = open(d / "mitmdump.log", "w")
    proc = subprocess.Popen([mitmdump, "--listen-host", "127.0.0.1", "--listen-port", str(port),
                             "--set", f"confdir={d}", "--set",
                             f"ssl_verify_upstream_trusted_ca={certs['up_ca']}", "-q"],
                            stdout=log, stderr=log)
    wait_port(port, "mitmdump", proc)
    return Setup(name="mitmdump", proxy=f"http://127.0.0.1:{port}", procs=[proc], pid=proc.pid)


# --- scenarios ----------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    what: str
    path: str
    args: list[str]
    bytes_per_response: int = 1024


def scenarios(seconds: float, requests: int) -> list[Scenario]:
    z = f"{seconds}s"
    return [
        Scenario("ka-1k", "keep-alive, 1 KiB, one client", "/1k", ["-n", str(requests), "-c", "1"]),
        Scenario("rate-1k", "keep-alive, 1 KiB, fixed 1,000 req/s (latency-corrected)", "/1k",
                 ["-z", z, "-c", "4", "-q", "1000", "--latency-correction"]),
        Scenario("flat-1k", "keep-alive, 1 KiB, 16 clients flat out", "/1k", ["-z", z, "-c", "16"]),
        Scenario("flat-1m", "keep-alive, 1 MiB, 16 clients flat out", "/1m", ["-z", z, "-c", "16"],
                 bytes_per_response=1 << 20),
        Scenario("new-1k", "a new connection per request, 1 KiB, 4 clients", "/1k",
                 ["-z", z, "-c", "4", "--disable-keepalive"]),
        Scenario("h2-1k", "HTTP/2, 1 KiB, 16 streams over 4 connections", "/1k",
                 ["-z", z, "-c", "4", "-p", "4", "--http2"]),
    ]


def oha_run(oha: str, setup: Setup, sc: Scenario, up_port: int) -> dict:
    url = f"https://{HOST}:{up_port}{setup.path_prefix}{sc.path}"
    cmd = [oha, "--no-tui", "--output-format", "json", "--insecure", *sc.args]
    if setup.proxy:
        cmd += ["-x", setup.proxy]
        if setup.proxy_header:
            cmd += ["--proxy-header", setup.proxy_header]
    cmd.append(url)
    before = cpu_used(setup.pid)
    waited = runq_wait_us([setup.pid]) if setup.pid else None
    out = json.loads(run(cmd))
    after = cpu_used(setup.pid)
    if waited is not None:
        now = runq_wait_us([setup.pid])
        waited = None if now is None else now - waited
    dist = out.get("statusCodeDistribution", {})
    ok = dist.get("200", 0)
    bad = {k: v for k, v in dist.items() if k != "200"}
    # A timed run (-z) ends with the requests in flight at its deadline aborted.
    errors = {k: v for k, v in out.get("errorDistribution", {}).items()
              if k != "aborted due to deadline"}
    if bad or errors or ok == 0:
        raise RuntimeError(f"{setup.name} / {sc.name}: statuses {dist}, errors {errors}")
    pct = out["latencyPercentiles"]
    res = {"p50_us": pct["p50"] * 1e6, "p99_us": pct["p99"] * 1e6,
           "rps": out["summary"]["requestsPerSec"], "ok": ok}
    if before and after:
        # The proxy's own CPU per answered request: on shared cores a proxy that costs less
        # shows up only partly in its latency and rate, fully here.
        res["cpu_us"] = (after[0] - before[0]) / ok
        if before[1] is not None and after[1] is not None:
            res["audit_cpu_us"] = (after[1] - before[1]) / ok
    if waited is not None:
        # Time the proxy's threads were runnable but without a CPU: a tail that this is a
        # large part of is the cores' sharing, not the proxy's work.
        res["runq_us"] = waited / ok
    return res


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_used(pid: int | None) -> tuple[float, float | None] | None:
    """CPU the process has used, µs (utime + stime of every thread, those gone included),
    and its audit writer thread's (`ostiary-audit`, from its scheduler statistics, ns
    precise), if it has one."""
    if pid is None:
        return None
    try:
        # The command name may hold spaces: the fields counted from after its ')'.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = (int(fields[11]) + int(fields[12])) * 1e6 / CLK_TCK
        audit = None
        for task in Path(f"/proc/{pid}/task").iterdir():
            if (task / "comm").read_text().strip() == "ostiary-audit":
                audit = int((task / "schedstat").read_text().split()[0]) / 1e3
        return total, audit
    except (OSError, ValueError, IndexError):
        return None


def runq_wait_us(pids: list[int]) -> float | None:
    """Microseconds the processes' threads have spent runnable but waiting for a CPU
    (schedstat's second field), summed over every thread alive now."""
    total = 0
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            return None
        for task in tasks:
            try:
                total += int((task / "schedstat").read_text().split()[1])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended since the listing
    return total / 1e3


def idle_us() -> float:
    """Microseconds every CPU of the machine has spent idle since boot, summed (/proc/stat,
    kept in ticks of 1/100 s)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return (int(fields[4]) + int(fields[5])) * 1e4


def children(pid: int) -> list[int]:
    """The process's children (nginx's workers under its master)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def rss_kib(pid: int | None, field: str = "VmRSS") -> int | None:
    """The process's resident set (`VmRSS`), or one part of it: `RssAnon` is the memory it
    allocated, without the pages of its own binary (file-backed, shared, ~30 MiB of
    Ostiary's text that the small relays do not have)."""
    if pid is None:
        return None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return None


def resident_by_mapping(pid: int | None) -> dict | None:
    """Where the resident set is, from `/proc/<pid>/smaps`, in KiB: the binary's own pages
    (code, read-only data, data written at start-up), other files (shared libraries), glibc's
    main heap (`[heap]`: SQLite and the C libraries allocate there), the main thread's stack,
    and anonymous mappings by what holds them: mimalloc's arenas (reservations of at least
    32 MiB), glibc's heaps of threads other than the main one (SQLite's allocations), and the
    rest (threads' stacks, large single allocations, the binary's `.bss`)."""
    if pid is None:
        return None
    exe = os.readlink(f"/proc/{pid}/exe")
    out: dict[str, int] = {}
    largest: list[tuple[int, int, str]] = []
    name, size = "", 0
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            size = end - start
            path = fields[5] if len(fields) > 5 else ""
            perms = fields[1]
            if path == exe:
                name = "binary " + {"r-x": "code", "r--": "read-only", "rw-": "data"}.get(perms[:3], perms)
            elif path == "[heap]":
                name = "glibc main heap"
            elif path == "[stack]":
                name = "main stack"
            elif path.startswith("/"):
                name = "other files"
            elif path:
                name = path
            elif size >= 32 << 20:
                name = "anonymous: mimalloc's arenas"
            elif start % (64 << 20) == 0:
                # glibc's heaps for threads other than the main one: 64 MiB reserved at an
                # aligned address, the part in use mapped read-write (SQLite allocates here).
                name = "anonymous: glibc's thread heaps"
            else:
                name = "anonymous: stacks, large blocks"
        elif fields[0] == "Rss:":
            out[name] = out.get(name, 0) + int(fields[1])
            if name.startswith("anonymous"):
                largest.append((int(fields[1]), size >> 10, name.split(": ")[1]))
    where: dict = {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v}
    # The anonymous mappings holding most, as [resident KiB, mapped KiB, what].
    where["largest anonymous"] = sorted(largest, reverse=True)[:24]
    where["threads"] = len(os.listdir(f"/proc/{pid}/task"))
    return where
