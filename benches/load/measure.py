"""The load harness's measurements other than the timed table: a `perf` profile, counts per
request (system calls, heap allocations, instructions), resident memory with idle
connections and while streaming (with massif's heap snapshot), and event streams' time to
first byte.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
from collections import Counter
from pathlib import Path

from setups import (HOST, RESULTS, Scenario, Setup, free_port, idle_us, oha_run, resident_by_mapping, rss_kib, run,
                    runq_wait_us, wait_port)


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


def watched(opts, setup: Setup, up_port: int, what: str, counter: list[str], attach: float,
            stderr=None) -> dict:
    """`--requests` one-client requests while `counter` (strace, perf stat) watches the
    proxy: started `attach` seconds before the first request, stopped with SIGINT (so that
    it writes its counts) after the audit writer's last group. `oha_run`'s result."""
    proc = subprocess.Popen(counter, stderr=stderr)
    time.sleep(attach)
    try:
        res = oha_run(opts.oha, setup, Scenario(what, "", "/1k",
                                                ["-n", str(opts.requests), "-c", "1"]), up_port)
        time.sleep(0.3)  # the audit writer's last group
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait()
    return res


def syscalls(opts, setup: Setup, up_port: int, work: Path) -> dict:
    """System calls per request of one proxy, by name: `strace -c -f` attached to the
    process (every thread, an audit writer's included) over `--requests` one-client
    requests after the warm-up. A count, like `--allocations`: where a proxy's requests go
    to the kernel (reads that find nothing, wakeups between threads, the trail's writes)
    and how often, whatever the machine's speed."""
    out = work / f"{setup.name}.strace"
    # strace says it attached to each thread on stderr; its counts go to `out`.
    res = watched(opts, setup, up_port, "syscalls",
                  ["strace", "-c", "-f", "-o", str(out), "-p", str(setup.pid)],
                  attach=1.0, stderr=subprocess.DEVNULL)
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


# A wake-up this late is one a one-client p99 sees: it is the size of the whole gap between
# the proxies' tails (docs/benchmarks.md, "Where the one-client tail waits").
LATE_MS = 0.1


def sched(opts, setup: Setup, up_port: int, work: Path) -> dict:
    """Where one proxy's one-client tail waits: `perf sched record` of the whole machine over
    `--requests` one-client requests, then, of every switch-in of one of the proxy's threads
    (`perf sched timehist`: the delay from its wake-up to running), those later than
    `LATE_MS` and what had the CPU before each: another thread of the proxy (its audit
    writer), the upstream or the client, another program on the machine, or nothing (a CPU
    woken from idle, which on a virtual machine takes the host's time)."""
    data = work / f"{setup.name}.sched"
    res = watched(opts, setup, up_port, "sched",
                  ["perf", "sched", "record", "-a", "-o", str(data)],
                  attach=1.0, stderr=subprocess.DEVNULL)
    threads = {t.name: (t / "comm").read_text().strip()
               for t in Path(f"/proc/{setup.pid}/task").iterdir()}
    hist = subprocess.run(["perf", "sched", "timehist", "-i", str(data)], check=True,
                          capture_output=True, text=True).stdout.splitlines()
    def tid(task: str) -> str:  # `name[tid]` or `name[tid/pid]`
        return task.rsplit("[", 1)[-1].split("/")[0].rstrip("]")

    before: dict[str, str] = {}  # CPU -> the task that ran on it last
    after: Counter[str] = Counter()
    switch_ins = late = 0
    for line in hist:
        # time, [cpu], task[tid/pid], wait, sch delay, run time (ms); the header's lines
        # have no `[cpu]`
        fields = line.split()
        if len(fields) < 6 or not fields[1].startswith("["):
            continue
        cpu, task = fields[1], " ".join(fields[2:-3])
        try:
            delay = float(fields[-2])
        except ValueError:
            continue
        if tid(task) in threads:
            switch_ins += 1
            if delay > LATE_MS:
                late += 1
                prev = before.get(cpu, "?")
                own = threads.get(tid(prev))
                after[f"{own} (own)" if own else prev.rsplit("[", 1)[0]] += 1
        before[cpu] = task
    return {"requests": res["ok"], "p50_us": res["p50_us"], "p99_us": res["p99_us"],
            "switch_ins": switch_ins, "late": late, "late_per_1000_requests":
            1000 * late / max(res["ok"], 1), "after": dict(after.most_common())}


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
    try:
        res = watched(opts, setup, up_port, "allocations",
                      ["perf", "stat", "-x", ",", "-e", ",".join(events), "-o", str(out),
                       "-p", str(setup.pid)], attach=0.5)
    finally:
        for name in events:
            subprocess.run(["perf", "probe", "-q", "-d", name], capture_output=True)
    counts = {}
    for line in out.read_text().splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].strip().isdigit():
            counts[ALLOC_FUNCTIONS[events.index(fields[2])]] = int(fields[0]) / res["ok"]
    return {"requests": res["ok"], "per_request": sum(counts.values()), "by_function": counts}


def under_valgrind(work: Path, binary: Path, name: str, tool: str, always: bool = False,
                   mangled: bool = False) -> Path:
    """A wrapper that runs `ostiary serve` under valgrind's `tool` (callgrind or massif; any
    other subcommand, the session it mints, as it is; `always`: every invocation, for the
    relay rung), its output next to the rung's files; `mangled`: functions named by their
    symbols, as the linker knows them."""
    wrapper = work / f"{name}.{tool}.sh"
    demangle = " --demangle=no" if mangled else ""
    wrapper.write_text(f"""#!/bin/sh
if [ "$1" = serve ] || [ {'1' if always else '0'} = 1 ]; then
    exec valgrind -q{demangle} --tool={tool} --{tool}-out-file={work / name}.{tool}.%p {binary} "$@"
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
    new = callgrind_dump(setup.name, setup.pid, work)
    text = max(new, key=lambda f: f.stat().st_mtime).read_text(errors="replace")
    for line in text.splitlines():
        if line.startswith(("summary:", "totals:")):
            total = int(line.split()[1])
            return {"requests": res["ok"], "per_request": total / res["ok"]}
    raise RuntimeError(f"{setup.name}: callgrind's dump has no total")


def callgrind_dump(name: str, pid: int, work: Path) -> set[Path]:
    """The files of the dump callgrind writes when asked (`callgrind_control -d`) for the
    process `pid`, which runs with `--callgrind-out-file` under `work` named `name`."""
    before = set(work.glob(f"{name}.callgrind.*"))
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        new = set(work.glob(f"{name}.callgrind.*")) - before
        if new:
            time.sleep(0.5)  # written, not only created
            return new
        time.sleep(0.2)
    raise RuntimeError(f"{name}: callgrind wrote no dump")


def functions(opts, setup: Setup, up_port: int, work: Path) -> set[str]:
    """The symbols of every function one Ostiary rung ran under callgrind (started with
    `mangled`), from its start-up through the warm-up to `--requests` one-client requests:
    what `scripts/build-dist.sh` lays out together (benches/order.py). The counters are
    never zeroed, so the dump holds start-up too, which a profile-guided build's
    instrumentation cannot see in the standard library and the C it links (SQLite, ring)."""
    oha_run(opts.oha, setup, Scenario("functions", "", "/1k",
                                      ["-n", str(opts.requests), "-c", "1"]), up_port)
    time.sleep(1.0)  # the audit writer's last group
    return dumped_functions(setup.name, setup.pid, work)


def default_functions(wrapper: Path, work: Path) -> set[str]:
    """The same for `ostiary serve` on the built-in defaults (only its listeners and state
    directory moved), up to the moment it answers: a proxy started without a config runs
    start-up code the rungs' configs do not (its own policies, no credential file), and each
    function left out of the order costs the 64 KiB or more of code the kernel maps in
    around it."""
    d = work / "ostiary-defaults"
    d.mkdir()
    proxy_port, control_port = free_port(), free_port()
    (d / "ostiary.toml").write_text(f"""[listen]
proxy = "127.0.0.1:{proxy_port}"
control = "127.0.0.1:{control_port}"
[state]
dir = "{d}/state"
""")
    log = open(d / "ostiary.log", "w")
    proc = subprocess.Popen([str(wrapper), "serve", "--config", str(d / "ostiary.toml")],
                            env=dict(os.environ, RUST_LOG="warn"), stdout=log, stderr=log)
    try:
        wait_port(control_port, "ostiary (defaults)", proc, timeout=120, log=d / "ostiary.log")
        time.sleep(1.0)  # what start-up does after it listens
        return dumped_functions("ostiary-defaults", proc.pid, work)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def dumped_functions(name: str, pid: int, work: Path) -> set[str]:
    """Every function in the dump callgrind writes now for `pid` ([`callgrind_dump`])."""
    names: set[str] = set()
    for dump in callgrind_dump(name, pid, work):
        # `fn=(id) name` or `cfn=(id) name` names a function the first time the dump
        # mentions it, as one that ran or as a callee; `fn=(id)` alone repeats it. Every
        # function that ran has a `fn=` line of its own.
        known: dict[str, str] = {}
        ran: set[str] = set()
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith(("fn=(", "cfn=(")):
                id_, _, rest = line.split("=(", 1)[1].partition(")")
                if rest.strip():
                    known[id_] = rest.strip()
                if line.startswith("fn="):
                    ran.add(id_)
        names |= {known[i] for i in ran if i in known}
    return names


def memory(setup: Setup, up_port: int, token_header: str | None, idle: int,
           heap_snapshot: Path | None = None, alpn: str = "http/1.1",
           linger: float = 0, batch: int = 50) -> dict:
    """RSS of the proxy before, and with `idle` intercepted keep-alive connections open, each
    having carried one request (CONNECT, TLS with the proxy's leaf, GET /1k) over `alpn`
    (HTTP/1.1 or h2); under massif, the heap's snapshot at that moment written to
    `heap_snapshot`. With `linger`, RSS again that many seconds later, and how many of the
    connections the proxy had closed by then (an idle one is closed after the proxy's
    `header_read_timeout`). The connections are opened `batch` at a time."""
    import asyncio
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols([alpn])
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
        if writer.get_extra_info("ssl_object").selected_alpn_protocol() != alpn:
            raise RuntimeError(f"the proxy did not take {alpn}")
        if alpn == "h2":
            await h2_get(reader, writer)
            return reader, writer
        writer.write(f"GET /1k HTTP/1.1\r\nHost: {HOST}:{up_port}\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        lengths = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")]
        if lengths:
            await reader.readexactly(lengths[0])
        else:  # chunked (Ostiary streams what it scrubs)
            await reader.readuntil(b"\r\n0\r\n\r\n")
        return reader, writer

    async def h2_get(reader, writer):
        import h2.connection
        import h2.events

        conn = h2.connection.H2Connection()
        conn.initiate_connection()
        conn.send_headers(1, [(":method", "GET"), (":scheme", "https"),
                              (":authority", f"{HOST}:{up_port}"), (":path", "/1k")],
                          end_stream=True)
        writer.write(conn.data_to_send())
        await writer.drain()
        while True:
            data = await reader.read(65536)
            if not data:
                raise RuntimeError("the proxy closed the h2 connection mid-answer")
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.StreamReset):
                    raise RuntimeError(f"the proxy reset the request: {ev.error_code}")
                if isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                if isinstance(ev, h2.events.StreamEnded):
                    writer.write(conn.data_to_send())
                    await writer.drain()
                    return
            writer.write(conn.data_to_send())
            await writer.drain()

    async def closed(reader) -> bool:
        """Whether the proxy has closed the connection (what it sent before, such as h2's
        GOAWAY, read and dropped)."""
        try:
            while await asyncio.wait_for(reader.read(65536), 0.05):
                pass
            return True
        except asyncio.TimeoutError:
            return False
        except (ConnectionError, ssl.SSLError):
            return True

    async def run():
        before, before_anon = rss_kib(setup.pid), rss_kib(setup.pid, "RssAnon")
        conns = []
        for i in range(0, idle, batch):
            conns += await asyncio.gather(*(one() for _ in range(min(batch, idle - i))))
        await asyncio.sleep(1)
        held, held_anon = rss_kib(setup.pid), rss_kib(setup.pid, "RssAnon")
        where = resident_by_mapping(setup.pid)
        # Sockets beyond the agents' own: mostly the upstream connections the pools keep.
        sockets = sum(1 for fd in os.listdir(f"/proc/{setup.pid}/fd")
                      if os.readlink(f"/proc/{setup.pid}/fd/{fd}").startswith("socket:"))
        if heap_snapshot:
            # Where the heap is while the connections are idle: massif's detailed snapshot,
            # taken through its gdbserver, for `ms_print`.
            subprocess.run(["vgdb", f"--pid={setup.pid}", "detailed_snapshot",
                            str(heap_snapshot)], check=True, capture_output=True, timeout=120)
        row = {"alpn": alpn, "batch": batch, "idle_connections": len(conns), "sockets": sockets, "rss_before_kib": before,
               "rss_idle_kib": held, "anon_before_kib": before_anon, "anon_idle_kib": held_anon,
               "resident_idle_kib": where}
        if linger:
            await asyncio.sleep(linger)
            row["linger_s"] = linger
            row["rss_later_kib"] = rss_kib(setup.pid)
            row["anon_later_kib"] = rss_kib(setup.pid, "RssAnon")
            row["closed_by_proxy"] = sum(await asyncio.gather(*(closed(r) for r, _ in conns)))
        for _, w in conns:
            w.close()
        return row

    return asyncio.run(run())


def sse(setup: Setup, up_port: int, streams: int, upstream: list[int]) -> dict:
    """Time to first byte of an event stream (1,024 events of 1 KiB, text/event-stream) and
    the rate it streams at, one client on one keep-alive connection, `streams` times. The
    client is Python's http.client, the same for every setup: its own cost cancels out of
    the added figures.

    Also the time per stream that the proxy's threads, and the upstream's (`upstream`, nginx's
    workers), spent runnable but waiting for a CPU, and that the machine's cores spent idle:
    nginx writes the whole body in one burst into a socket buffer that has grown to
    megabytes, and a proxy thread the kernel woke on nginx's core waits behind it while the
    other core idles (docs/benchmarks.md, "An event stream's first byte")."""
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
    proxy_pids = [setup.pid] if setup.pid else []
    waited = (runq_wait_us(proxy_pids), runq_wait_us(upstream), idle_us())
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
    after = (runq_wait_us(proxy_pids), runq_wait_us(upstream), idle_us())
    conn.close()
    ttfb.sort()
    total.sort()
    med = statistics.median(total)

    def per_stream(before, now):
        return None if before is None or now is None else (now - before) / streams

    return {"p50_us": ttfb[len(ttfb) // 2] * 1e6, "p99_us": ttfb[len(ttfb) * 99 // 100] * 1e6,
            "p10_us": ttfb[len(ttfb) // 10] * 1e6, "p90_us": ttfb[len(ttfb) * 9 // 10] * 1e6,
            "rps": 1 / med, "mib_per_s": size / med / (1 << 20), "ok": streams,
            "proxy_runq_us": per_stream(waited[0], after[0]) if proxy_pids else None,
            "upstream_runq_us": per_stream(waited[1], after[1]),
            "idle_us": per_stream(waited[2], after[2])}


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
