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
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from measure import (LATE_MS, allocations, default_functions, functions, instructions, memory,
                     profile, sched, sse, streaming_memory, syscalls, under_valgrind)
from setups import (RESULTS, ROOT, RUNGS, Scenario, Setup, children, make_certs, free_port, oha_run,
                    rss_kib, scenarios, start_live_events, start_mitmdump, start_nginx,
                    start_ostiary, start_relay, start_squid)

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
                         "`listen.KEY = V` lines go into [listen]; the B binary defaults to "
                         "--ostiary)")
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
    ap.add_argument("--memory-alpn", default="http/1.1", choices=["http/1.1", "h2"],
                    help="with --memory: what the idle connections speak inside the tunnel")
    ap.add_argument("--memory-batch", type=int, default=50, metavar="N",
                    help="with --memory: open the idle connections N at a time")
    ap.add_argument("--memory-linger", type=float, default=0, metavar="SECONDS",
                    help="with --memory: read RSS again this long after, and count the idle "
                         "connections the proxy closed by then")
    ap.add_argument("--keep-work", action="store_true",
                    help="keep the run's working directory (callgrind dumps for "
                         "callgrind_annotate, the proxies' logs and configs)")
    ap.add_argument("--allocations", action="store_true",
                    help="instead of the table: heap allocations per request of each Ostiary "
                         "rung (perf uprobes on mimalloc; needs root), --requests of one client")
    ap.add_argument("--syscalls", action="store_true",
                    help="instead of the table: system calls per request of every proxy, by "
                         "name (strace -c), --requests of one client")
    ap.add_argument("--sched", action="store_true",
                    help="instead of the table: where each proxy's one-client tail waits "
                         "(perf sched; needs root): its threads' wake-ups later than 100 us "
                         "and what had the CPU before each, --requests of one client, "
                         "--rounds times")
    ap.add_argument("--instructions", action="store_true",
                    help="instead of the table: instructions per request of each Ostiary rung "
                         "(the relay rung's too) "
                         "under callgrind (valgrind), --requests of one client")
    ap.add_argument("--functions", default="", metavar="PATH",
                    help="instead of the table: write to PATH the symbols of every function the "
                         "Ostiary rungs ran under callgrind, start-up to --requests one-client "
                         "requests (benches/order.py lays the shipped build out by them)")
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
    if opts.massif and b"mi_malloc_aligned" in Path(opts.ostiary).read_bytes():
        # massif sees only the malloc family; mimalloc's arenas would leave the snapshot
        # nearly empty, which reads as a proxy that holds nothing.
        sys.exit(f"--massif: {opts.ostiary} allocates with mimalloc, which massif cannot see; "
                 "build it on glibc's malloc (cargo build --release -p ostiary-cli "
                 "--no-default-features) and pass --ostiary target/release/ostiary")

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
    live = None  # the sse-live scenario's upstream, when it runs
    try:
        if not only or "ostiary-relay" in only:
            relay = Path(opts.relay)
            if opts.massif:
                relay = under_valgrind(work, relay, "ostiary-relay", "massif", always=True)
            if opts.instructions:
                relay = under_valgrind(work, relay, "ostiary-relay", "callgrind", always=True)
            setups.append(start_relay(work, certs, relay, "ostiary-relay"))
        def binary(path: str, name: str) -> Path:
            if opts.functions:
                return under_valgrind(work, Path(path), name, "callgrind", mangled=True)
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
        if opts.sched:
            rows = {}
            for r in range(opts.rounds):
                for s in setups:
                    if s.proxy and s.pid:
                        row = sched(opts, s, up_port, work)
                        rows.setdefault(s.name, []).append(row)
                        top = ", ".join(f"{k} {n}" for k, n in list(row["after"].items())[:6])
                        print(f"round {r + 1} {s.name:<16} p50 {row['p50_us']:5.0f}µs p99 "
                              f"{row['p99_us']:5.0f}µs  {row['late']} of {row['switch_ins']} "
                              f"wake-ups later than {LATE_MS * 1000:.0f}µs "
                              f"({row['late_per_1000_requests']:.1f} per 1,000 requests), "
                              f"after: {top}", flush=True)
            for name, runs in rows.items():
                causes = sum((Counter(row["after"]) for row in runs), Counter())
                top = ", ".join(f"{k} {n}" for k, n in causes.most_common(6))
                print(f"{name:<16} median of {len(runs)} rounds: p99 "
                      f"{statistics.median(r['p99_us'] for r in runs):5.0f}µs, "
                      f"{statistics.median(r['late_per_1000_requests'] for r in runs):.1f} late "
                      f"wake-ups per 1,000 requests; after, in all: {top}", flush=True)
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / f"{opts.label}.json").write_text(json.dumps(rows, indent=1) + "\n")
            return
        if opts.functions:
            ran: set[str] = set()
            for s in setups:
                if s.name.startswith("ostiary-") and s.name != "ostiary-relay":
                    found = functions(opts, s, up_port, work)
                    print(f"{s.name:<16} ran {len(found)} functions", flush=True)
                    ran |= found
            found = default_functions(under_valgrind(work, Path(opts.ostiary), "ostiary-defaults",
                                                     "callgrind", mangled=True), work)
            print(f"{'ostiary-defaults':<16} ran {len(found)} functions", flush=True)
            ran |= found
            Path(opts.functions).write_text("".join(f"{n}\n" for n in sorted(ran)))
            return
        if opts.instructions or opts.allocations:
            # Counts, one Ostiary rung at a time: instructions under callgrind, or heap
            # allocations through uprobes on the binary the rung runs.
            what = "instructions" if opts.instructions else "allocations"
            rows = {}
            for s in setups:
                # The relay rung is counted too (its instructions are the baseline the
                # pipeline adds to); its allocations are glibc's, which the uprobes miss.
                if s.name.startswith("ostiary-") and (opts.instructions
                                                      or s.name != "ostiary-relay"):
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
                    rows[s.name] = memory(s, up_port, token, opts.memory, snapshot,
                                          opts.memory_alpn, opts.memory_linger,
                                          opts.memory_batch)
                    r = rows[s.name]
                    if snapshot:
                        print(f"{s.name:<16} heap snapshot with {opts.memory} idle connections: "
                              f"{snapshot} (ms_print it)", flush=True)
                        continue  # massif's pace makes the streaming peak meaningless
                    print(f"{s.name:<16} RSS {r['rss_before_kib'] / 1024:6.1f} MiB -> "
                          f"{r['rss_idle_kib'] / 1024:6.1f} MiB with {r['idle_connections']} idle "
                          f"intercepted connections (allocated: {r['anon_before_kib'] / 1024:.1f} -> "
                          f"{r['anon_idle_kib'] / 1024:.1f} MiB, {r['alpn']}; {r['sockets']} sockets open)",
                          flush=True)
                    if "rss_later_kib" in r:
                        print(f"{s.name:<16} {r['linger_s']:.0f} s later: RSS "
                              f"{r['rss_later_kib'] / 1024:6.1f} MiB (allocated "
                              f"{r['anon_later_kib'] / 1024:.1f} MiB), {r['closed_by_proxy']} of "
                              f"the {r['idle_connections']} closed by the proxy", flush=True)
                    time.sleep(2)  # let the idle connections close
                    r["streaming"] = streaming_memory(opts, s, up_port, 100)
                    m = r["streaming"]
                    # A load that failed (its answers refused, say) streamed nothing: its
                    # peak is no figure.
                    peaks = [f"{m[f'rss_peak_kib_{size}'] / 1024:6.1f} MiB"
                             if "error" not in m[f"load_{size}"]
                             else f"failed ({m[f'load_{size}']['error']})"
                             for size in ("1m", "16m")]
                    print(f"{s.name:<16} peak RSS, 100 clients streaming: 1 MiB bodies "
                          f"{peaks[0]}, 16 MiB bodies {peaks[1]}", flush=True)
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / f"{opts.label}.json").write_text(json.dumps(rows, indent=1) + "\n")
            return
        raw: dict[str, dict[str, list[dict]]] = {}
        unsupported: dict[tuple[str, str], str] = {}
        # Event streams, timed by one Python client: (scenario, upstream port, streams per
        # round, the upstream's processes whose run-queue wait is read, what it measures).
        streamed = []
        wanted = set(opts.scenarios.split(",")) if opts.scenarios else {"sse", "sse-live"}
        if opts.streams and "sse" in wanted:
            streamed.append(("sse", up_port, opts.streams, children(nginx.pid),
                             "event stream (1,024 events of 1 KiB): time to first byte "
                             "(p50/p99), streams/s"))
        if opts.streams and "sse-live" in wanted:
            live_port = free_port()
            live = start_live_events(certs, live_port)
            streamed.append(("sse-live", live_port, min(opts.streams, 200), [live.pid],
                             "event stream as it happens (8 events of 1 KiB, 2 ms apart): time "
                             "to first byte (p50/p99)"))
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
                    if "runq_us" in res:
                        cpu += f", {res['runq_us']:.1f}µs waiting for a CPU"
                    print(f"round {r + 1} {sc.name:<8} {s.name:<16} p50 {res['p50_us']:>7.0f}µs "
                          f"p99 {res['p99_us']:>7.0f}µs {res['rps']:>9.0f} req/s{cpu}", flush=True)
            for name, port, streams, upstream, _ in streamed:
                order = setups[r % len(setups):] + setups[: r % len(setups)]
                for s in order:
                    res = sse(s, port, streams, upstream)
                    raw.setdefault(name, {}).setdefault(s.name, []).append(res)
                    waits = f" upstream {res['upstream_runq_us']:.0f}µs"
                    if res["proxy_runq_us"] is not None:
                        waits = f" proxy {res['proxy_runq_us']:.0f}µs," + waits
                    print(f"round {r + 1} {name:<8} {s.name:<16} TTFB p10/50/90 "
                          f"{res['p10_us']:>5.0f}/{res['p50_us']:>5.0f}/{res['p90_us']:>5.0f}µs "
                          f"p99 {res['p99_us']:>7.0f}µs {res['mib_per_s']:>7.0f} MiB/s; "
                          f"waited for a CPU per stream:{waits}; cores idle "
                          f"{res['idle_us']:.0f}µs", flush=True)
        scs += [Scenario(name, what, "/events", []) for name, _, _, _, what in streamed
                if name in raw]
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
        if live:
            live.terminate()
        nginx.terminate()
        nginx.wait()
        if opts.keep_work:
            print(f"kept {work} (callgrind dumps, logs, configs)")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
