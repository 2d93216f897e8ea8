#!/usr/bin/env bash
# The side-by-side load harness (docs/benchmarks.md, "Side by side"): installs what it needs,
# builds Ostiary and the hudsucker relay in release, then runs benches/load/harness.py, which
# starts nginx, Ostiary's ladder, hudsucker, squid (ssl-bump) and mitmdump on loopback and
# measures them with oha in one run. Arguments go to the harness (`--help` lists them).
#
#   bash benches/load.sh                      # everything, 3 rounds (about 25 minutes)
#   bash benches/load.sh --rounds 1 --seconds 2 --only ostiary-tool,hudsucker
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOLS=$ROOT/benches/.tools
VENV=$ROOT/benches/.venv
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
# uprobes with perf.
if [[ " $* " == *" --profile "* || " $* " == *" --allocations "* ]]; then
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

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
# The build that ships (fat LTO, one codegen unit) with its symbols; the first build takes
# a while (~17 minutes on two cores), later ones relink.
cargo build --profile profiling --quiet -p ostiary-cli
cargo build --profile profiling --quiet -p ostiary-benches --bin relay
cargo build --release --quiet --manifest-path benches/peers/hudsucker-relay/Cargo.toml

exec "$VENV/bin/python" benches/load/harness.py \
    --ostiary "$CARGO_TARGET_DIR/profiling/ostiary" \
    --hudsucker "$CARGO_TARGET_DIR/release/hudsucker-relay" \
    --relay "$CARGO_TARGET_DIR/profiling/relay" \
    --oha "$TOOLS/bin/oha" \
    --mitmdump "$VENV/bin/mitmdump" "$@"
