#!/usr/bin/env python3
"""The side-by-side load harness: one local HTTPS upstream (nginx), the same requests sent
directly and through each proxy (Ostiary as a ladder of configurations, a bare hudsucker
relay, squid with ssl-bump, mitmdump), all measured in one run with `oha`, rounds rotated so
that drift on a noisy machine falls on every setup alike; each figure is the median of its
rounds. Prints one table, writes JSON and a PNG plot under benches/results/.

Run through benches/load.sh, which installs and builds what this needs. Traffic stays on
loopback: every listener binds 127.0.0.1, the only upstream is the local nginx.
"""

from __future__ import annotations

import argparse
import secrets
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
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
    (root / "16m").write_bytes(mib * 16)
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
""" for size in ("1k", "1m", "events"))

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
    (d / "ostiary.toml").write_text(f"""
[listen]
proxy = "127.0.0.1:{proxy_port}"
control = "127.0.0.1:{control_port}"
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
    out = json.loads(run(cmd))
    after = cpu_used(setup.pid)
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


# --- the report ---------------------------------------------------------------------------


def summarise(raw: dict, names: list[str], scs: list[Scenario]) -> dict:
    table = {}
    for sc in scs:
        rows = {}
        for name in names:
            runs = raw.get(sc.name, {}).get(name, [])
            if not runs:
                continue
            rows[name] = {k: statistics.median(r[k] for r in runs) for k in ("p50_us", "p99_us", "rps")}
            for k in ("cpu_us", "audit_cpu_us"):
                if all(k in r for r in runs):
                    rows[name][k] = statistics.median(r[k] for r in runs)
            rows[name]["rounds"] = len(runs)
        direct = rows.get("direct")
        ostiary = rows.get("ostiary-tool")
        for name, row in rows.items():
            if direct:
                row["p50_added_us"] = row["p50_us"] - direct["p50_us"]
                row["p99_added_us"] = row["p99_us"] - direct["p99_us"]
                row["rps_vs_direct"] = row["rps"] / direct["rps"]
            if ostiary:
                row["rps_vs_ostiary"] = row["rps"] / ostiary["rps"]
        table[sc.name] = rows
    return table


def print_table(table: dict, scs: list[Scenario]):
    for sc in scs:
        rows = table.get(sc.name)
        if not rows:
            continue
        print(f"\n{sc.name}: {sc.what}")
        print(f"  {'setup':<16}{'p50':>10}{'p99':>10}{'p50 +':>10}{'p99 +':>10}{'req/s':>10}"
              f"{'vs direct':>11}{'vs ostiary':>12}{'CPU/req':>10}{'audit':>8}")
        for name, r in rows.items():
            cpu = f"{r['cpu_us']:>8.1f}µs" if "cpu_us" in r else f"{'':>10}"
            audit = f"{r['audit_cpu_us']:>6.1f}µs" if "audit_cpu_us" in r else ""
            print(f"  {name:<16}{r['p50_us']:>8.0f}µs{r['p99_us']:>8.0f}µs"
                  f"{r.get('p50_added_us', 0):>+8.0f}µs{r.get('p99_added_us', 0):>+8.0f}µs"
                  f"{r['rps']:>10.0f}{r.get('rps_vs_direct', 1):>10.3f}×"
                  f"{r.get('rps_vs_ostiary', 0):>11.3f}×{cpu}{audit}")


def plot(table: dict, scs: list[Scenario], path: Path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot written", file=sys.stderr)
        return
    shown = [sc for sc in scs if sc.name in table]
    fig, axes = plt.subplots(len(shown), 2, figsize=(12, 2.6 * len(shown)), squeeze=False)
    for i, sc in enumerate(shown):
        rows = table[sc.name]
        names = [n for n in rows if n != "direct"]
        added = [rows[n].get("p50_added_us", 0) for n in names]
        ratio = [rows[n].get("rps_vs_direct", 0) for n in names]
        axes[i][0].barh(names, added, color="#4a7bb7")
        axes[i][0].set_xscale("symlog", linthresh=100)
        axes[i][0].set_title(f"{sc.name}: p50 added over direct (µs)", fontsize=9)
        axes[i][1].barh(names, ratio, color="#b76e4a")
        axes[i][1].set_title(f"{sc.name}: requests/s ÷ direct", fontsize=9)
        for ax in axes[i]:
            ax.tick_params(labelsize=8)
            ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def profile(opts, setup: Setup, up_port: int, work: Path):
    """perf samples (cpu-clock: these machines have no hardware counters) of the setup's
    process under `--profile-clients` clients (16) flat out, folded by inferno into a
    flamegraph."""
    data = work / "perf.data"
    perf = subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", "997", "-g",
                             "--call-graph", "dwarf,16384", "-p", str(setup.pid), "-o", str(data)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    sc = Scenario("profile", "", opts.profile_path,
                  ["-z", f"{opts.seconds}s", "-c", str(opts.profile_clients)])
    res = oha_run(opts.oha, setup, sc, up_port)
    perf.send_signal(signal.SIGINT)
    perf.wait()
    print(f"{setup.name}: {res['rps']:.0f} req/s while profiled")
    script = subprocess.run(["perf", "script", "--no-inline", "-i", str(data)], check=True, capture_output=True)
    inferno = Path(opts.inferno)
    folded = subprocess.run([str(inferno / "inferno-collapse-perf")], input=script.stdout,
                            check=True, capture_output=True).stdout
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{opts.label}.folded").write_bytes(folded)
    svg = subprocess.run([str(inferno / "inferno-flamegraph"), "--title",
                          f"{setup.name}, {opts.profile_clients} clients flat out, {opts.profile_path}"],
                         input=folded, check=True, capture_output=True).stdout
    (RESULTS / f"{opts.label}.svg").write_bytes(svg)
    print(f"wrote {RESULTS / (opts.label + '.svg')}")


# mimalloc's entry points as the `mimalloc` crate's global allocator calls them: every
# allocation, zeroed allocation and reallocation of the process goes through one of these.
ALLOC_FUNCTIONS = ("mi_malloc_aligned", "mi_zalloc_aligned", "mi_realloc_aligned")


def syscalls(opts, setup: Setup, up_port: int, work: Path) -> dict:
    """System calls per request of one proxy, by name: `strace -c -f` attached to the
    process (every thread, an audit writer's included) over `--requests` one-client
    requests after the warm-up. A count, like `--allocations`: where a proxy's requests go
    to the kernel (reads that find nothing, wakeups between threads, the trail's writes)
    and how often, whatever the machine's speed."""
    out = work / f"{setup.name}.strace"
    tracer = subprocess.Popen(["strace", "-c", "-f", "-o", str(out), "-p", str(setup.pid)],
                              stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached to every thread before the first request
    try:
        res = oha_run(opts.oha, setup, Scenario("syscalls", "", "/1k",
                                                ["-n", str(opts.requests), "-c", "1"]), up_port)
        time.sleep(0.3)  # the audit writer's last group
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait()
    by_name, errors = {}, {}
    for line in out.read_text().splitlines():
        fields = line.split()
        # % time, seconds, usecs/call, calls, [errors,] name
        if len(fields) in (5, 6) and fields[3].isdigit() and fields[-1] != "total":
            by_name[fields[-1]] = int(fields[3]) / res["ok"]
            if len(fields) == 6:
                errors[fields[-1]] = int(fields[4]) / res["ok"]
    return {"requests": res["ok"], "per_request": sum(by_name.values()),
            "by_name": dict(sorted(by_name.items(), key=lambda kv: -kv[1])), "errors": errors}


def allocations(opts, setup: Setup, binary: Path, up_port: int, work: Path) -> dict:
    """Exact heap allocations per request of one Ostiary rung: perf counts uprobes on
    mimalloc's entry points (every thread, the audit writer's included) over `--requests`
    one-client requests. A count, not a time: the same build and requests give the same
    figure on any machine, so two builds can be compared without rounds."""
    tracing = Path("/sys/kernel/tracing")
    if not (tracing / "uprobe_events").exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(tracing)], check=False,
                       capture_output=True)
    group = "ostiary_alloc"
    events = []
    for i, fn in enumerate(ALLOC_FUNCTIONS):
        name = f"{group}:{setup.name.replace('-', '_').replace('@', '_')}_{i}"
        subprocess.run(["perf", "probe", "-q", "-d", name], capture_output=True)
        run(["perf", "probe", "-q", "-x", str(binary), "--add", f"{name}={fn}"])
        events.append(name)
    out = work / f"{setup.name}.allocs"
    counter = subprocess.Popen(["perf", "stat", "-x", ",", "-e", ",".join(events),
                                "-o", str(out), "-p", str(setup.pid)])
    time.sleep(0.5)
    try:
        res = oha_run(opts.oha, setup, Scenario("allocations", "", "/1k",
                                                ["-n", str(opts.requests), "-c", "1"]), up_port)
        time.sleep(0.3)  # the audit writer's last group
    finally:
        counter.send_signal(signal.SIGINT)
        counter.wait()
        for name in events:
            subprocess.run(["perf", "probe", "-q", "-d", name], capture_output=True)
    counts = {}
    for line in out.read_text().splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].strip().isdigit():
            counts[ALLOC_FUNCTIONS[events.index(fields[2])]] = int(fields[0]) / res["ok"]
    return {"requests": res["ok"], "per_request": sum(counts.values()), "by_function": counts}


def under_valgrind(work: Path, binary: Path, name: str, tool: str, always: bool = False) -> Path:
    """A wrapper that runs `ostiary serve` under valgrind's `tool` (callgrind or massif; any
    other subcommand, the session it mints, as it is; `always`: every invocation, for the
    relay rung), its output next to the rung's files."""
    wrapper = work / f"{name}.{tool}.sh"
    wrapper.write_text(f"""#!/bin/sh
if [ "$1" = serve ] || [ {'1' if always else '0'} = 1 ]; then
    exec valgrind -q --tool={tool} --{tool}-out-file={work / name}.{tool}.%p {binary} "$@"
fi
exec {binary} "$@"
""")
    wrapper.chmod(0o755)
    return wrapper


def instructions(opts, setup: Setup, up_port: int, work: Path) -> dict:
    """Instructions per request of one Ostiary rung run under callgrind: its counters zeroed
    after the warm-up, dumped after `--requests` one-client requests (every thread: the
    audit writer's included). Instructions, not seconds, so they repeat within ~0.5% from
    run to run whatever else the machine does. valgrind hides AVX-512 and SHA-NI, so crypto
    (SHA-256 above all: the audit chain) counts for more than it costs on the machine."""
    subprocess.run(["callgrind_control", "-z", str(setup.pid)], check=True, capture_output=True)
    res = oha_run(opts.oha, setup, Scenario("instructions", "", "/1k",
                                            ["-n", str(opts.requests), "-c", "1"]), up_port)
    time.sleep(1.0)  # the audit writer's last group
    dumps = set(work.glob(f"{setup.name}.callgrind.*"))
    subprocess.run(["callgrind_control", "-d", str(setup.pid)], check=True, capture_output=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        new = set(work.glob(f"{setup.name}.callgrind.*")) - dumps
        if new:
            time.sleep(0.5)
            text = max(new, key=lambda f: f.stat().st_mtime).read_text(errors="replace")
            for line in text.splitlines():
                if line.startswith(("summary:", "totals:")):
                    total = int(line.split()[1])
                    return {"requests": res["ok"], "per_request": total / res["ok"]}
        time.sleep(0.2)
    raise RuntimeError(f"{setup.name}: callgrind wrote no dump")


def memory(setup: Setup, up_port: int, token_header: str | None, idle: int,
           heap_snapshot: Path | None = None) -> dict:
    """RSS of the proxy before, and with `idle` intercepted keep-alive connections open, each
    having carried one request (CONNECT, TLS with the proxy's leaf, GET /1k); under massif,
    the heap's snapshot at that moment written to `heap_snapshot`."""
    import asyncio
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    port = int(setup.proxy.rsplit(":", 1)[1])
    auth = f"{token_header}\r\n" if token_header else ""

    async def one():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"CONNECT {HOST}:{up_port} HTTP/1.1\r\nHost: {HOST}:{up_port}\r\n{auth}\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"CONNECT refused: {head[:80]!r}")
        await writer.start_tls(ctx, server_hostname=HOST)
        writer.write(f"GET /1k HTTP/1.1\r\nHost: {HOST}:{up_port}\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        lengths = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")]
        if lengths:
            await reader.readexactly(lengths[0])
        else:  # chunked (Ostiary streams what it scrubs)
            await reader.readuntil(b"\r\n0\r\n\r\n")
        return writer

    async def run():
        before, before_anon = rss_kib(setup.pid), rss_kib(setup.pid, "RssAnon")
        writers = []
        for i in range(0, idle, 50):
            writers += await asyncio.gather(*(one() for _ in range(min(50, idle - i))))
        await asyncio.sleep(1)
        held, held_anon = rss_kib(setup.pid), rss_kib(setup.pid, "RssAnon")
        if heap_snapshot:
            # Where the heap is while the connections are idle: massif's detailed snapshot,
            # taken through its gdbserver, for `ms_print`.
            subprocess.run(["vgdb", f"--pid={setup.pid}", "detailed_snapshot",
                            str(heap_snapshot)], check=True, capture_output=True, timeout=120)
        for w in writers:
            w.close()
        return {"idle_connections": len(writers), "rss_before_kib": before, "rss_idle_kib": held,
                "anon_before_kib": before_anon, "anon_idle_kib": held_anon}

    return asyncio.run(run())


def sse(setup: Setup, up_port: int, streams: int) -> dict:
    """Time to first byte of an event stream (1,024 events of 1 KiB, text/event-stream) and
    the rate it streams at, one client on one keep-alive connection, `streams` times. The
    client is Python's http.client, the same for every setup: its own cost cancels out of
    the added figures."""
    import http.client
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if setup.proxy:
        port = int(setup.proxy.rsplit(":", 1)[1])
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
        headers = {}
        if setup.proxy_header:
            name, value = setup.proxy_header.split(": ", 1)
            headers[name] = value
        conn.set_tunnel(HOST, up_port, headers=headers)
    else:
        conn = http.client.HTTPSConnection(HOST, up_port, context=ctx, timeout=30)
    path = f"{setup.path_prefix}/events"
    ttfb, total, size = [], [], 0
    for _ in range(streams):
        started = time.perf_counter()
        conn.request("GET", path, headers={"Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"{setup.name} / sse: status {resp.status}")
        first = resp.read(1)
        ttfb.append(time.perf_counter() - started)
        rest = resp.read()
        total.append(time.perf_counter() - started)
        size = len(first) + len(rest)
    conn.close()
    ttfb.sort()
    total.sort()
    med = statistics.median(total)
    return {"p50_us": ttfb[len(ttfb) // 2] * 1e6, "p99_us": ttfb[len(ttfb) * 99 // 100] * 1e6,
            "rps": 1 / med, "mib_per_s": size / med / (1 << 20), "ok": streams}


def streaming_memory(opts, setup: Setup, up_port: int, clients: int) -> dict:
    """Peak RSS of the proxy while `clients` clients stream 1 MiB and then 16 MiB bodies
    flat out: flat if the proxy streams, proportional to the body if it buffers."""
    out = {"rss_before_kib": rss_kib(setup.pid)}
    for path in ("/1m", "/16m"):
        peak = 0
        sc = Scenario("stream", "", path, ["-z", f"{opts.seconds}s", "-c", str(clients)])
        done = []
        import threading

        def load():
            try:
                done.append(oha_run(opts.oha, setup, sc, up_port))
            except RuntimeError as e:
                done.append({"error": str(e)[:200]})

        t = threading.Thread(target=load)
        t.start()
        while t.is_alive():
            peak = max(peak, rss_kib(setup.pid) or 0)
            time.sleep(0.02)
        t.join()
        out[f"rss_peak_kib{path.replace('/', '_')}"] = peak
        out[f"load{path.replace('/', '_')}"] = done[0]
    return out


# --- main ---------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each timed run")
    ap.add_argument("--requests", type=int, default=5400, help="requests of the one-client run")
    ap.add_argument("--only", default="", help="comma-separated setups to run (direct always runs)")
    ap.add_argument("--scenarios", default="", help="comma-separated scenarios to run")
    ap.add_argument("--label", default="load", help="file name of the JSON and PNG under benches/results/")
    ap.add_argument("--ostiary", default=str(ROOT / "target" / "profiling" / "ostiary"))
    ap.add_argument("--ostiary-b", default="", metavar="PATH",
                    help="a second Ostiary build (A/B): each selected rung runs from it too, "
                         "as `<rung>@b`, in the same rounds")
    ap.add_argument("--config-b", default="", metavar="TOML",
                    help="lines appended to the config of the `@b` rungs (A/B of a setting; "
                         "the B binary defaults to --ostiary)")
    ap.add_argument("--env-b", default=[], action="append", metavar="NAME=VALUE",
                    help="an environment variable of the `@b` rungs (A/B of one; repeatable)")
    ap.add_argument("--hudsucker", default=str(ROOT / "target" / "release" / "hudsucker-relay"))
    ap.add_argument("--relay", default=str(ROOT / "target" / "profiling" / "relay"))
    ap.add_argument("--oha", default=str(ROOT / "benches" / ".tools" / "bin" / "oha"))
    ap.add_argument("--profile", default="",
                    help="instead of the table: profile this setup flat out (--profile-path) with "
                         "perf and write a flamegraph SVG under benches/results/")
    ap.add_argument("--profile-clients", type=int, default=16, metavar="N",
                    help="clients of the profiled load (1: the one-client latency path)")
    ap.add_argument("--profile-path", default="/1k", metavar="PATH",
                    help="what the profiled load fetches (/1k, /1m)")
    ap.add_argument("--memory", type=int, default=0, metavar="N",
                    help="instead of the table: RSS of each proxy with N idle intercepted "
                         "keep-alive connections")
    ap.add_argument("--keep-work", action="store_true",
                    help="keep the run's working directory (callgrind dumps for "
                         "callgrind_annotate, the proxies' logs and configs)")
    ap.add_argument("--allocations", action="store_true",
                    help="instead of the table: heap allocations per request of each Ostiary "
                         "rung (perf uprobes on mimalloc; needs root), --requests of one client")
    ap.add_argument("--syscalls", action="store_true",
                    help="instead of the table: system calls per request of every proxy, by "
                         "name (strace -c), --requests of one client")
    ap.add_argument("--instructions", action="store_true",
                    help="instead of the table: instructions per request of each Ostiary rung "
                         "under callgrind (valgrind), --requests of one client")
    ap.add_argument("--massif", action="store_true",
                    help="with --memory: run each Ostiary rung (the relay's too) under "
                         "massif (valgrind) and "
                         "write its heap's snapshot with the idle connections open under "
                         "benches/results/ (RSS figures are valgrind's, not the proxy's)")
    ap.add_argument("--streams", type=int, default=1000,
                    help="event streams of the sse scenario per round (0: skip it)")
    ap.add_argument("--inferno", default=str(ROOT / "benches" / ".tools" / "bin"))
    ap.add_argument("--mitmdump", default=shutil.which("mitmdump") or "mitmdump")
    opts = ap.parse_args()

    scs = scenarios(opts.seconds, opts.requests)
    if opts.scenarios:
        wanted = set(opts.scenarios.split(","))
        scs = [s for s in scs if s.name in wanted]
    work = Path(tempfile.mkdtemp(prefix="ostiary-load-"))
    os.chmod(work, 0o755)
    certs = make_certs(work)
    up_port = free_port()
    nginx = start_nginx(work, certs, up_port)
    setups: list[Setup] = [Setup(name="direct", proxy=None)]
    only = set(filter(None, opts.only.split(",")))
    try:
        if not only or "ostiary-relay" in only:
            relay = Path(opts.relay)
            if opts.massif:
                relay = under_valgrind(work, relay, "ostiary-relay", "massif", always=True)
            setups.append(start_relay(work, certs, relay, "ostiary-relay"))
        def binary(path: str, name: str) -> Path:
            if opts.instructions:
                return under_valgrind(work, Path(path), name, "callgrind")
            if opts.massif:
                return under_valgrind(work, Path(path), name, "massif")
            return Path(path)

        for name, rung in RUNGS.items():
            if not only or name in only:
                setups.append(start_ostiary(work, certs, up_port, name, rung,
                                            binary(opts.ostiary, name)))
                if opts.ostiary_b or opts.config_b or opts.env_b:
                    env_b = dict(v.split("=", 1) for v in opts.env_b)
                    setups.append(start_ostiary(work, certs, up_port, f"{name}@b", rung,
                                                binary(opts.ostiary_b or opts.ostiary, f"{name}@b"),
                                                opts.config_b.replace("\\n", "\n"), env_b))
        if not only or "hudsucker" in only:
            setups.append(start_relay(work, certs, Path(opts.hudsucker), "hudsucker"))
        if not only or "squid-bump" in only:
            setups.append(start_squid(work, certs))
        if not only or "mitmdump" in only:
            setups.append(start_mitmdump(work, certs, opts.mitmdump))

        # Warm every path (leaf minting, pools, squid's helpers) before measuring.
        warm = Scenario("warm", "", "/1k", ["-n", "200", "-c", "4"])
        for s in setups:
            oha_run(opts.oha, s, warm, up_port)

        if opts.profile:
            target = next(s for s in setups if s.name == opts.profile)
            profile(opts, target, up_port, work)
            return
        if opts.syscalls:
            rows = {}
            for s in setups:
                if s.proxy and s.pid:
                    rows[s.name] = syscalls(opts, s, up_port, work)
                    r = rows[s.name]
                    top = ", ".join(f"{name} {n:.2f}" for name, n in r["by_name"].items()
                                    if n >= 0.05)
                    print(f"{s.name:<16} {r['per_request']:6.2f} system calls per request "
                          f"({r['requests']} requests, one client): {top}", flush=True)
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / f"{opts.label}.json").write_text(json.dumps(rows, indent=1) + "\n")
            return
        if opts.instructions or opts.allocations:
            # Counts, one Ostiary rung at a time: instructions under callgrind, or heap
            # allocations through uprobes on the binary the rung runs.
            what = "instructions" if opts.instructions else "allocations"
            rows = {}
            for s in setups:
                if s.name.startswith("ostiary-") and s.name != "ostiary-relay":
                    if opts.instructions:
                        rows[s.name] = instructions(opts, s, up_port, work)
                    else:
                        binary = Path(opts.ostiary_b or opts.ostiary) if s.name.endswith("@b") \
                            else Path(opts.ostiary)
                        rows[s.name] = allocations(opts, s, binary, up_port, work)
                    print(f"{s.name:<16} {rows[s.name]['per_request']:9.1f} {what} per request "
                          f"({rows[s.name]['requests']} requests, one client)", flush=True)
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / f"{opts.label}.json").write_text(json.dumps(rows, indent=1) + "\n")
            return
        if opts.memory:
            rows = {}
            for s in setups:
                if s.proxy and not s.name.startswith("ostiary-tunnel"):
                    token = s.proxy_header
                    massif = opts.massif and s.name.startswith("ostiary-")
                    snapshot = RESULTS / f"{opts.label}.{s.name}.massif" if massif else None
                    if snapshot:
                        RESULTS.mkdir(parents=True, exist_ok=True)
                    rows[s.name] = memory(s, up_port, token, opts.memory, snapshot)
                    r = rows[s.name]
                    if snapshot:
                        print(f"{s.name:<16} heap snapshot with {opts.memory} idle connections: "
                              f"{snapshot} (ms_print it)", flush=True)
                        continue  # massif's pace makes the streaming peak meaningless
                    print(f"{s.name:<16} RSS {r['rss_before_kib'] / 1024:6.1f} MiB -> "
                          f"{r['rss_idle_kib'] / 1024:6.1f} MiB with {r['idle_connections']} idle "
                          f"intercepted connections (allocated: {r['anon_before_kib'] / 1024:.1f} -> "
                          f"{r['anon_idle_kib'] / 1024:.1f} MiB)", flush=True)
                    time.sleep(2)  # let the idle connections close
                    r["streaming"] = streaming_memory(opts, s, up_port, 100)
                    m = r["streaming"]
                    print(f"{s.name:<16} peak RSS, 100 clients streaming: 1 MiB bodies "
                          f"{m['rss_peak_kib_1m'] / 1024:6.1f} MiB, 16 MiB bodies "
                          f"{m['rss_peak_kib_16m'] / 1024:6.1f} MiB", flush=True)
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / f"{opts.label}.json").write_text(json.dumps(rows, indent=1) + "\n")
            return
        raw: dict[str, dict[str, list[dict]]] = {}
        unsupported: dict[tuple[str, str], str] = {}
        for r in range(opts.rounds):
            for sc in scs:
                order = setups[r % len(setups):] + setups[: r % len(setups)]
                for s in order:
                    if (sc.name, s.name) in unsupported:
                        continue
                    try:
                        res = oha_run(opts.oha, s, sc, up_port)
                    except RuntimeError as e:
                        # squid speaks no HTTP/2 to clients, for one: reported, not fatal.
                        unsupported[(sc.name, s.name)] = str(e)[:200]
                        print(f"round {r + 1} {sc.name:<8} {s.name:<16} failed: {e}", flush=True)
                        continue
                    raw.setdefault(sc.name, {}).setdefault(s.name, []).append(res)
                    cpu = f" {res['cpu_us']:>6.1f}µs CPU/req" if "cpu_us" in res else ""
                    print(f"round {r + 1} {sc.name:<8} {s.name:<16} p50 {res['p50_us']:>7.0f}µs "
                          f"p99 {res['p99_us']:>7.0f}µs {res['rps']:>9.0f} req/s{cpu}", flush=True)
            if opts.streams and (not opts.scenarios or "sse" in opts.scenarios.split(",")):
                order = setups[r % len(setups):] + setups[: r % len(setups)]
                for s in order:
                    res = sse(s, up_port, opts.streams)
                    raw.setdefault("sse", {}).setdefault(s.name, []).append(res)
                    print(f"round {r + 1} sse      {s.name:<16} TTFB p50 {res['p50_us']:>7.0f}µs "
                          f"p99 {res['p99_us']:>7.0f}µs {res['mib_per_s']:>7.0f} MiB/s", flush=True)
        if "sse" in raw:
            scs.append(Scenario("sse", "event stream (1,024 events of 1 KiB): time to first "
                                "byte (p50/p99), streams/s", "/events", []))
        rss = {s.name: rss_kib(s.pid) for s in setups if s.pid}
        table = summarise(raw, [s.name for s in setups], scs)
        print_table(table, scs)
        RESULTS.mkdir(parents=True, exist_ok=True)
        doc = {
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"cpus": os.cpu_count(), "kernel": os.uname().release},
            "rounds": opts.rounds, "seconds": opts.seconds, "requests": opts.requests,
            "scenarios": {s.name: s.what for s in scs},
            "rss_kib_after": rss, "table": table, "raw": raw,
            "failed": {f"{sc}/{name}": why for (sc, name), why in unsupported.items()},
        }
        (RESULTS / f"{opts.label}.json").write_text(json.dumps(doc, indent=1) + "\n")
        plot(table, scs, RESULTS / f"{opts.label}.png")
        print(f"\nwrote {RESULTS / (opts.label + '.json')} and .png")
    finally:
        for s in setups:
            s.stop()
        nginx.terminate()
        nginx.wait()
        if opts.keep_work:
            print(f"kept {work} (callgrind dumps, logs, configs)")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
