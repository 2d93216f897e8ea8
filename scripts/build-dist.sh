#!/usr/bin/env bash
# The build that ships: `cargo build --locked`, optimised with the execution profile committed
# in deploy/pgo/ostiary.profdata.gz (profile-guided optimisation: the compiler inlines, lays
# out and places code by what the request path ran; docs/benchmarks.md, "A profile-guided
# build"). `bash benches/pgo.sh` takes the profile anew.
#
#   bash scripts/build-dist.sh                                     # target/dist/ostiary
#   bash scripts/build-dist.sh --profile profiling -p ostiary-cli  # what benches/load.sh measures
#   bash scripts/build-dist.sh --check                             # only: can rustc read the profile?
#
# Without arguments it builds the `profiling` profile and strips a copy to target/dist/ostiary.
# The profile names functions by their symbols, whose hashes cargo derives from every
# setting of the build profile, `strip` included: a `--profile dist` build (stripped by the
# linker) matched almost none of it (a `.text.hot` of 6 bytes against 2.2 MiB). The
# `profiling` profile is `dist` with its symbols, the build the profile is taken on and the
# harness measures; stripped afterwards it is the `dist` binary, profile-guided.
# With arguments, they go to cargo build as they are.
# A function changed since the profile was taken is built as it would be without one, so a
# stale profile costs speed, never correctness. OSTIARY_PGO_PROFILE names another packed
# profile (the tests' damaged copy).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
PACKED=${OSTIARY_PGO_PROFILE:-$ROOT/deploy/pgo/ostiary.profdata.gz}
PROFDATA=$TARGET/pgo/ostiary.profdata

if [ ! -f "$PACKED" ]; then
    echo "build-dist: $PACKED is missing (bash benches/pgo.sh takes it)" >&2
    exit 1
fi
mkdir -p "$TARGET/pgo"
# Unpacked only when it changed: rustc lists the profile among a crate's inputs, and a new
# file would rebuild every crate.
gzip -dc "$PACKED" >"$PROFDATA.new"
if cmp -s "$PROFDATA.new" "$PROFDATA"; then
    rm "$PROFDATA.new"
else
    mv "$PROFDATA.new" "$PROFDATA"
fi

# rustc only warns when it cannot read a profile (a damaged file, a format newer than its
# LLVM), and then builds without it. A binary built so would ship slower with nothing to
# say why: a one-line crate compiled with the profile must come out without a word.
probe=$(mktemp -d)
echo 'pub fn probe(a: u64) -> u64 { a.rotate_left(7) }' >"$probe/lib.rs"
if ! said=$(rustc --crate-type lib -O --emit obj -o "$probe/lib.o" \
    "-Cprofile-use=$PROFDATA" -Cllvm-args=-no-pgo-warn-mismatch "$probe/lib.rs" 2>&1) \
    || [ -n "$said" ]; then
    rm -rf "$probe"
    echo "build-dist: rustc cannot use the profile $PACKED:" >&2
    echo "$said" >&2
    exit 1
fi
rm -rf "$probe"
if [ "${1:-}" = "--check" ]; then
    echo "build-dist: rustc reads $PACKED"
    exit 0
fi

# `-no-pgo-warn-mismatch`: a function changed since the profile was taken is built
# without it; one warning per such function would bury the build's own.
# `-z keep-text-section-prefix`: the linker keeps the code the profile found hot in one
# range (`.text.hot`) and the code it never saw run apart (`.text.unlikely`), so the request
# path spans fewer pages.
export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-Cprofile-use=$PROFDATA -Cllvm-args=-no-pgo-warn-mismatch -Clink-arg=-Wl,-z,keep-text-section-prefix"
cd "$ROOT"
if (($# > 0)); then
    exec cargo build --locked "$@"
fi
cargo build --locked --profile profiling -p ostiary-cli --bin ostiary
mkdir -p "$TARGET/dist"
strip --strip-all -o "$TARGET/dist/ostiary" "$TARGET/profiling/ostiary"
echo "build-dist: $TARGET/dist/ostiary"
