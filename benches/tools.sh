#!/usr/bin/env bash
# What the load harness and the profile-taking run need, installed once: Debian's nginx,
# squid and openssl, oha from crates.io, mitmproxy and matplotlib from PyPI, and, for the
# harness's options that ask for them, perf, strace, valgrind and inferno. Sourced by
# benches/load.sh and benches/pgo.sh with their arguments; expects ROOT, TOOLS and VENV set.
OHA_VERSION=1.16.0
INFERNO_VERSION=0.12.8

need_apt=()
command -v nginx >/dev/null || need_apt+=(nginx-light)
command -v squid >/dev/null || need_apt+=(squid-openssl)
command -v openssl >/dev/null || need_apt+=(openssl)
if ((${#need_apt[@]})); then
    echo "installing ${need_apt[*]} (Debian)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}" >/dev/null
fi
# Debian starts the packaged services; the harness runs its own on free loopback ports.
for svc in nginx squid; do
    if [ -x "/etc/init.d/$svc" ]; then "/etc/init.d/$svc" stop >/dev/null 2>&1 || true; fi
done

if [ ! -x "$TOOLS/bin/oha" ] || ! "$TOOLS/bin/oha" --version | grep -q "$OHA_VERSION"; then
    echo "installing oha $OHA_VERSION (crates.io)"
    cargo install oha --version "$OHA_VERSION" --locked --root "$TOOLS" --quiet
fi
# `--profile` records with perf and folds the stacks with inferno; `--allocations` counts
# uprobes with perf; `--sched` records the scheduler's switches with perf.
if [[ " $* " == *" --profile "* || " $* " == *" --allocations "* || " $* " == *" --sched "* ]]; then
    command -v perf >/dev/null || {
        echo "installing linux-perf (Debian)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q linux-perf >/dev/null
    }
fi
if [[ " $* " == *" --syscalls "* ]] && ! command -v strace >/dev/null; then
    echo "installing strace (Debian)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q strace >/dev/null
fi
if [[ " $* " == *" --instructions "* || " $* " == *" --massif "* ]] \
    && ! command -v valgrind >/dev/null; then
    echo "installing valgrind (Debian)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind >/dev/null
fi
if [[ " $* " == *" --profile "* ]]; then
    if ! cargo install --list --root "$TOOLS" | grep -q "^inferno v$INFERNO_VERSION:"; then
        echo "installing inferno $INFERNO_VERSION (crates.io)"
        cargo install inferno --version "$INFERNO_VERSION" --locked --root "$TOOLS" --quiet
    fi
fi
if [ ! -x "$VENV/bin/mitmdump" ]; then
    echo "installing mitmproxy and matplotlib (PyPI) into benches/.venv"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q mitmproxy==11.0.2 matplotlib==3.11.2
fi
