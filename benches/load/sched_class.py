#!/usr/bin/env python3
"""Change how the kernel schedules the threads of a running `@b` rung, to A/B a scheduling
class in one harness run without building anything: run it beside the harness, and give
the `@b` rungs a marker in their environment, which it looks for.

    python3 benches/load/sched_class.py idle &    # the audit writer in SCHED_IDLE
    python3 benches/load/sched_class.py slice &   # every other thread a 100 us EEVDF slice
    python3 benches/load/sched_class.py batch &   # the audit writer in SCHED_BATCH
    python3 benches/load/sched_class.py wslice &  # the audit writer alone a 100 us slice
    python3 benches/load/sched_class.py pin &     # the audit writer kept to the last CPU
    benches/.venv/bin/python benches/load/harness.py ... --env-b OSTIARY_SCHED_B=1 --sched
    kill %1

`idle` puts each `ostiary-audit` thread in SCHED_IDLE (an unprivileged thread may enter it
but never leave it, so the proxy does not do this itself: docs/benchmarks.md, "Where the
one-client tail waits"). `slice` asks for a 100 us slice (`sched_setattr` with
`sched_runtime`, Linux 6.12 and later) for every thread but the writer, the kernel's
setting for tasks that want to preempt sooner. `batch` puts the writer in SCHED_BATCH, which
an unprivileged thread may leave again; `wslice` gives the writer alone the 100 us slice
(which bounds how long the kernel lets it run on before a woken thread, "run to parity");
`pin` keeps the writer to the machine's last CPU (`sched_setaffinity`). A diagnostic: it uses `sched_setattr` through
ctypes, which the proxy's own code (no `unsafe`) cannot. Polls every 0.2 s for new
processes and threads; stop it with a signal.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import time

SYS_SCHED_SETATTR = 314  # x86_64
SCHED_OTHER, SCHED_BATCH, SCHED_IDLE = 0, 3, 5
MARKER = b"OSTIARY_SCHED_B="

libc = ctypes.CDLL(None, use_errno=True)


def set_attr(tid: int, policy: int, runtime_ns: int):
    # struct sched_attr: size, policy, flags, nice, priority, runtime, deadline, period
    attr = ctypes.create_string_buffer(struct.pack("IIQiIQQQ", 56, policy, 0, 0, 0,
                                                   runtime_ns, 0, 0), 56)
    if libc.syscall(SYS_SCHED_SETATTR, tid, attr, 0) != 0:
        print(f"sched_setattr({tid}): {os.strerror(ctypes.get_errno())}", flush=True)


def marked_proxies():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if not argv[0].endswith(b"ostiary") or b"serve" not in argv:
                continue
            if MARKER in open(f"/proc/{pid}/environ", "rb").read():
                yield pid
        except OSError:
            continue


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("idle", "slice", "batch", "wslice", "pin"):
        sys.exit(__doc__)
    done: set[tuple[str, str]] = set()
    while True:
        for pid in marked_proxies():
            for tid in os.listdir(f"/proc/{pid}/task"):
                if (pid, tid) in done:
                    continue
                try:
                    comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
                except OSError:
                    continue
                if mode == "idle" and comm == "ostiary-audit":
                    set_attr(int(tid), SCHED_IDLE, 0)
                elif mode == "pin" and comm == "ostiary-audit":
                    os.sched_setaffinity(int(tid), {os.cpu_count() - 1})
                elif mode == "wslice" and comm == "ostiary-audit":
                    set_attr(int(tid), SCHED_OTHER, 100_000)
                elif mode == "batch" and comm == "ostiary-audit":
                    set_attr(int(tid), SCHED_BATCH, 0)
                elif mode == "slice" and comm != "ostiary-audit":
                    set_attr(int(tid), SCHED_OTHER, 100_000)
                done.add((pid, tid))
        time.sleep(0.2)


if __name__ == "__main__":
    main()
