#!/usr/bin/env bash
# The side-by-side load harness (docs/benchmarks.md, "Side by side"): installs what it needs,
# builds Ostiary as it ships and the hudsucker relay in release, then runs benches/load/harness.py, which
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
# shellcheck source=benches/tools.sh
source "$ROOT/benches/tools.sh" "$@"

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
# The build that ships (fat LTO, one codegen unit, optimised with the committed execution
# profile: scripts/build-dist.sh) with its symbols; the relay rung is built the same way.
# The first build takes a while (~17 minutes on two cores), later ones relink.
bash scripts/build-dist.sh --profile profiling --quiet -p ostiary-cli
bash scripts/build-dist.sh --profile profiling --quiet -p ostiary-benches --bin relay
cargo build --release --quiet --manifest-path benches/peers/hudsucker-relay/Cargo.toml

exec "$VENV/bin/python" benches/load/harness.py \
    --ostiary "$CARGO_TARGET_DIR/profiling/ostiary" \
    --hudsucker "$CARGO_TARGET_DIR/release/hudsucker-relay" \
    --relay "$CARGO_TARGET_DIR/profiling/relay" \
    --oha "$TOOLS/bin/oha" \
    --mitmdump "$VENV/bin/mitmdump" "$@"
