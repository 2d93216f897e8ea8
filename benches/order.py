"""The order the shipped build lays its functions out in (`scripts/build-dist.sh` hands it to
the linker as `--symbol-ordering-file`): every function the proxy runs, together, so that
the pages of code start-up and the request path touch are few (docs/benchmarks.md, "Code
laid out by what runs").

The kernel maps a program's code in by the 64 KiB or more around each page it faults on,
and what the process has mapped counts in its resident set. Laid out as the compiler
emits it, the few functions start-up runs once (the config's parsers, Cedar's schema
grammar, SQLite opening the store) sit between thousands that never run, and the proxy
kept 12 MiB of its code resident after start-up. Together they fill ~6 MiB.

Two sources, because neither sees everything:
- the execution profile (`llvm-profdata show --all-functions --counts`, on stdin): every
  function of Ostiary and its Rust dependencies that ran in the training, the most-run
  first (a function's largest block count);
- the symbols callgrind saw the proxy run (`harness.py --functions`, the file named as the
  argument): start-up included, and the code the profile cannot count because it was not
  built instrumented: the standard library's, SQLite's, ring's, mimalloc's.

Names the linker does not find (a function inlined everywhere, one renamed since) are
skipped by it (`--no-warn-symbol-ordering`): a stale order costs memory, never correctness.

    llvm-profdata show --all-functions --counts P | python3 benches/order.py RAN > ORDER
"""
from __future__ import annotations

import re
import sys

# What a linker can order: a symbol, mangled Rust or a C identifier, `.constprop.0` and the
# like included. callgrind also names `(below main)` and versioned glibc symbols
# (`name@@GLIBC_2.2.5`), which are not the binary's.
SYMBOL = re.compile(r"[A-Za-z_$.][A-Za-z0-9_$.]*")


def profiled(lines) -> list[tuple[int, str]]:
    """(largest block count, symbol) of each function in the profile listing."""
    out, name = [], None
    for line in lines:
        # `  NAME:` heads a function, NAME its symbol, prefixed with `FILE;` when it is
        # local to a codegen unit; `    Block counts: [...]` follows.
        if line.startswith("  ") and not line.startswith("   ") and line.rstrip().endswith(":"):
            name = line.strip()[:-1].rsplit(";", 1)[-1]
        elif name and line.startswith("    Block counts: ["):
            counts = [int(c) for c in line.split("[", 1)[1].strip().rstrip("]").split(",")
                      if c.strip()]
            out.append((max(counts, default=0), name))
            name = None
    return out


def order(listing, ran: list[str]) -> list[str]:
    """What start-up and the request path run, then the rest of the profile. Within the
    first part the most-run first (within `.text.hot` too, the hottest code shares pages),
    then what the profile could not count (the standard library's, SQLite's, ring's) by
    name. The profile's other functions — code the training ran and a proxy serving
    requests does not (approvals, MCP, runs, reloads) — come after all of it, so that a
    proxy's resident code is what it runs, not what sits beside it (docs/benchmarks.md,
    "Where the binary's resident code is after start-up")."""
    ran_set = set(ran)
    hot = [(count, name) for count, name in profiled(listing) if count > 0]
    by_count = sorted(hot, key=lambda t: (-t[0], t[1]))
    seen: set[str] = set()
    result = []

    def take(names):
        for name in names:
            if name not in seen:
                seen.add(name)
                result.append(name)

    take(name for _, name in by_count if name in ran_set)
    take(sorted(ran))
    take(name for _, name in by_count)
    return result


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        # callgrind marks a function's recursive activations `name'2`, `name'3`, ...
        ran = [re.sub(r"'[0-9]+$", "", line.strip()) for line in f]
    ran = [name for name in ran if SYMBOL.fullmatch(name)]
    names = order(sys.stdin, ran)
    if not names:
        print("order: no function in the profile or the list", file=sys.stderr)
        return 1
    sys.stdout.write("".join(f"{n}\n" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
