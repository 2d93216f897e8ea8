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
# profile (the tests' damaged copy), OSTIARY_PGO_ORDER another packed function order.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
PACKED=${OSTIARY_PGO_PROFILE:-$ROOT/deploy/pgo/ostiary.profdata.gz}
PROFDATA=$TARGET/pgo/ostiary.profdata
PACKED_ORDER=${OSTIARY_PGO_ORDER:-$ROOT/deploy/pgo/ostiary.order.gz}
ORDER=$TARGET/pgo/ostiary.order

for packed in "$PACKED" "$PACKED_ORDER"; do
    if [ ! -f "$packed" ]; then
        echo "build-dist: $packed is missing (bash benches/pgo.sh writes it)" >&2
        exit 1
    fi
done
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
# The order is only the linker's input, which cargo does not track: the binary is linked
# anew when it changes.
gzip -dc "$PACKED_ORDER" >"$ORDER.new"
if cmp -s "$ORDER.new" "$ORDER"; then
    rm "$ORDER.new"
else
    mv "$ORDER.new" "$ORDER"
    touch "$ROOT/cli/src/main.rs"
fi

# `-no-pgo-warn-mismatch`: a function changed since the profile was taken is built
# without it; one warning per such function would bury the build's own.
# `-z keep-text-section-prefix`: the linker keeps the code the profile found hot in one
# range (`.text.hot`) and the code it never saw run apart (`.text.unlikely`), so the request
# path spans fewer pages.
# `--symbol-ordering-file`: within each, every function the proxy was seen to run comes
# first (benches/order.py): start-up's code no longer sits among code that never runs, and
# the kernel maps in half as much of it (docs/benchmarks.md, "Code laid out by what runs").
# A name it does not find is skipped without a word.
# `-z pack-relative-relocs`: the relocations start-up applies to a position-independent
# binary packed (`DT_RELR`, glibc 2.36 and later; the binary says it needs it): 24 KiB
# instead of 1.4 MiB read at every start.
export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-Cprofile-use=$PROFDATA -Cllvm-args=-no-pgo-warn-mismatch -Clink-arg=-Wl,-z,keep-text-section-prefix -Clink-arg=-Wl,--symbol-ordering-file=$ORDER -Clink-arg=-Wl,--no-warn-symbol-ordering -Clink-arg=-Wl,-z,pack-relative-relocs"
cd "$ROOT"
if (($# > 0)); then
    exec cargo build --locked "$@"
fi
cargo build --locked --profile profiling -p ostiary-cli --bin ostiary
mkdir -p "$TARGET/dist"
strip --strip-all -o "$TARGET/dist/ostiary" "$TARGET/profiling/ostiary"
echo "build-dist: $TARGET/dist/ostiary"
