#!/usr/bin/env bash
# Takes the execution profile the shipped build is optimised with (scripts/build-dist.sh,
# docs/benchmarks.md "A profile-guided build"): builds Ostiary instrumented, runs the load
# harness's two Ostiary rungs (plain interception and the full tool pipeline) once over
# every kind of traffic it measures, and writes the merged profile, compressed, to
# deploy/pgo/ostiary.profdata.gz. Then it writes the order the linker lays functions out in
# (deploy/pgo/ostiary.order.gz, benches/order.py): the profile's functions and what callgrind
# sees the shipped build run, start-up included. Run it when the request path has changed
# much, and commit both files.
#
#   bash benches/pgo.sh               # ~40 minutes on two cores: the instrumented build, then
#                                     # the shipped one with the new profile
#   bash benches/pgo.sh --order-only  # only the order, from the committed profile and the
#                                     # shipped build with symbols (target/profiling/ostiary)
set -euo pipefail
ORDER_ONLY=0
if [ "${1:-}" = "--order-only" ]; then
    ORDER_ONLY=1
fi
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOLS=$ROOT/benches/.tools
VENV=$ROOT/benches/.venv
# shellcheck source=benches/tools.sh
source "$ROOT/benches/tools.sh"

# llvm-profdata of the toolchain's own LLVM: a profile is read by the LLVM that wrote it
# or a newer one.
SYSROOT=$(rustc --print sysroot)
HOST=$(rustc -vV | sed -n 's/^host: //p')
PROFDATA_TOOL=$SYSROOT/lib/rustlib/$HOST/bin/llvm-profdata
if [ ! -x "$PROFDATA_TOOL" ]; then
    echo "installing llvm-tools (rustup)"
    rustup component add llvm-tools-preview >/dev/null
fi

# Its own target directory: the instrumented build's flags would otherwise rebuild the
# shipped one's crates.
TRAIN_TARGET=$ROOT/target/pgo-train
RAW=$TRAIN_TARGET/raw
mkdir -p "$TRAIN_TARGET"
# The profile: the instrumented build, run over every kind of traffic.
train() {
    echo "building Ostiary instrumented (target/pgo-train)"
    RUSTFLAGS="-Cprofile-generate=$RAW" CARGO_TARGET_DIR=$TRAIN_TARGET \
        cargo build --locked --profile profiling --quiet -p ostiary-cli --bin ostiary
    # Emptied after the build: the build scripts and proc macros it ran were instrumented too,
    # and wrote their own profiles there.
    rm -rf "$RAW"
    mkdir -p "$RAW"

    # Every scenario once, short: what the profile needs is which code runs and how often
    # relative to the rest, not timings. Each process the harness starts writes its own file.
    echo "running the load harness's Ostiary rungs on the instrumented build"
    LLVM_PROFILE_FILE="$RAW/ostiary-%p-%m.profraw" "$VENV/bin/python" benches/load/harness.py \
        --ostiary "$TRAIN_TARGET/profiling/ostiary" --oha "$TOOLS/bin/oha" \
        --only ostiary-http,ostiary-tool \
        --scenarios ka-1k,rate-1k,flat-1k,flat-1m,new-1k,h2-1k,sse-live \
        --rounds 1 --seconds 2 --requests 2000 --streams 200 --label pgo-training >/dev/null
    rm -f benches/results/pgo-training.json benches/results/pgo-training.png

    shopt -s nullglob
    raws=("$RAW"/ostiary-*.profraw)
    if ((${#raws[@]} == 0)); then
        echo "pgo: the instrumented proxy wrote no profile" >&2
        exit 1
    fi
    # `--sparse` leaves out functions that never ran: they build as without a profile rather
    # than as cold, so paths the harness does not drive (approvals, MCP, runs) are not made
    # slower for it.
    "$PROFDATA_TOOL" merge --sparse -o "$TRAIN_TARGET/ostiary.profdata" "${raws[@]}"
    mkdir -p deploy/pgo
    gzip -9nc "$TRAIN_TARGET/ostiary.profdata" >deploy/pgo/ostiary.profdata.gz
    "$PROFDATA_TOOL" show "$TRAIN_TARGET/ostiary.profdata" | tail -4
    echo "wrote deploy/pgo/ostiary.profdata.gz ($(stat -c %s deploy/pgo/ostiary.profdata.gz) bytes) from ${#raws[@]} processes"
}

# The order is read off the shipped build, never the instrumented one. The profile matches
# both by their functions' names, but fat LTO names the local copies it makes (`.4568`:
# std's functions internalised into the crate) differently in each build: an order read off
# the instrumented build missed 125 of them, and the shipped build started with 1.7 MiB more
# of its code resident (docs/benchmarks.md, "The profile taken anew"). The shipped build's
# names do not depend on the order it was linked with (lld only places what rustc named).
BINARY=${CARGO_TARGET_DIR:-$ROOT/target}/profiling/ostiary
if ((ORDER_ONLY == 0)); then
    train
    echo "building the shipped build with the new profile (scripts/build-dist.sh)"
    bash scripts/build-dist.sh --profile profiling --quiet -p ostiary-cli --bin ostiary
else
    gzip -dc deploy/pgo/ostiary.profdata.gz >"$TRAIN_TARGET/ostiary.profdata"
    if [ ! -x "$BINARY" ]; then
        echo "pgo: $BINARY is missing (bash scripts/build-dist.sh builds it)" >&2
        exit 1
    fi
fi

# The order: both rungs' start-up, warm-up and a few hundred requests under callgrind.
# An instrumented binary writes a profile as it runs; this run's is not the training's.
echo "recording what the proxy runs under callgrind"
LLVM_PROFILE_FILE="$TRAIN_TARGET/order-raw/%p.profraw" "$VENV/bin/python" benches/load/harness.py \
    --ostiary "$BINARY" --oha "$TOOLS/bin/oha" --only ostiary-http,ostiary-tool \
    --requests 300 --functions "$TRAIN_TARGET/ran.txt" --label pgo-order
rm -rf "$TRAIN_TARGET/order-raw"
"$PROFDATA_TOOL" show --all-functions --counts "$TRAIN_TARGET/ostiary.profdata" \
    | python3 benches/order.py "$TRAIN_TARGET/ran.txt" >"$TRAIN_TARGET/ostiary.order"
gzip -9nc "$TRAIN_TARGET/ostiary.order" >deploy/pgo/ostiary.order.gz
echo "wrote deploy/pgo/ostiary.order.gz ($(wc -l <"$TRAIN_TARGET/ostiary.order") functions)"
