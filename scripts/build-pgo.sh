#!/usr/bin/env bash
# Builds tollgate with profile-guided optimisation and prints the binary's
# absolute path (under target/pgo/). An instrumented build serves a
# training load of `tollgate bench`: logins with failures from IPv4 and
# IPv6 sources, under each key derivation, plain checks, and, when
# redis-server is installed, shared-mode logins. The release build is then
# made again from the daemon's profile, which lays the hot paths out
# together: a login's code no longer overflows the instruction cache
# (docs/performance.md has the figures). Same source, same behaviour:
# only the code's layout and inlining change. Paths the load does not
# take (other routes, password digests, the operator's commands) are laid
# out as cold: correct, a little slower.
#
# Needs llvm-profdata matching rustc's LLVM: `rustup component add
# llvm-tools` (run here when missing; network once). Takes two release
# builds and about 30 s of load; PGO_SECONDS sets each load's length.
# RUSTFLAGS, if set, apply to both builds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fail() {
    echo "build-pgo: $*" >&2
    exit 1
}
[ -z "${CARGO_ENCODED_RUSTFLAGS:-}" ] || fail "CARGO_ENCODED_RUSTFLAGS is set: cargo would ignore the profile flags"
target=${CARGO_TARGET_DIR:-target}
host=$(rustc -vV | sed -n 's/^host: //p')
profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
    rustup component add llvm-tools >&2
fi

work=$(mktemp -d /tmp/tollgate-pgo.XXXXXX)
daemon="" redis=""
cleanup() {
    for pid in $daemon $redis; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# --target: build scripts and proc macros are built for the host apart,
# without the profile flags.
build() { # flag, target dir
    RUSTFLAGS="${RUSTFLAGS:-} $1" cargo build --release --locked --bin tollgate \
        --target "$host" --target-dir "$2" >&2
}
build "-Cprofile-generate=$work/raw" "$target/pgo-training"
trainer="$target/pgo-training/$host/release/tollgate"

# Waits for a socket, or fails with the log of the process that should
# have made it.
await_socket() { # socket, pid, log
    for _ in $(seq 200); do
        [ -S "$1" ] && return
        kill -0 "$2" 2>/dev/null || break
        sleep 0.05
    done
    [ -S "$1" ] || { cat "$3" >&2; fail "no socket at $1"; }
}

# One load against a fresh daemon: CONFIG is TOML after the socket and
# state lines. Only the daemon's profile is kept (the load generator is
# the same instrumented binary); the daemon writes it as it exits on
# SIGINT, with the environment of a service manager left out.
train() { # config, bench args...
    local config=$1 dir
    shift
    dir=$(mktemp -d "$work/run.XXXXXX")
    printf 'socket = "%s/s.sock"\nstate = "%s/state.redb"\n%s\n' "$dir" "$dir" "$config" >"$dir/tollgate.toml"
    env -u NOTIFY_SOCKET -u LISTEN_FDS -u LISTEN_PID -u WATCHDOG_USEC -u WATCHDOG_PID \
        LLVM_PROFILE_FILE="$work/raw/daemon-%p-%m.profraw" \
        "$trainer" serve --config "$dir/tollgate.toml" >"$dir/log" 2>&1 &
    daemon=$!
    await_socket "$dir/s.sock" "$daemon" "$dir/log"
    LLVM_PROFILE_FILE="$work/generator/%m.profraw" "$trainer" bench --socket "$dir/s.sock" \
        --duration "${PGO_SECONDS:-5}s" --keys 100000 --in-flight 16 --json "$@" >"$dir/bench.json"
    python3 - "$dir/bench.json" <<'PY' || { cat "$dir/log" >&2; fail "the load failed: $*"; }
import json, sys
r = json.load(open(sys.argv[1]))
print(f"trained on {r['requests']} requests", file=sys.stderr)
sys.exit(0 if r["requests"] > 0 and r["errors"] == 0 else 1)
PY
    kill -INT "$daemon"
    wait "$daemon" || { cat "$dir/log" >&2; fail "the daemon did not stop cleanly"; }
    daemon=""
}

train "" --route login --mix check-report
train "" --route login --mix check-report --key-offset 16777216 # IPv6 sources
train "key_derivation = 1" --route login --mix check-report
train "" --route request --mix check
if command -v redis-server >/dev/null; then
    redis-server --port 0 --unixsocket "$work/r.sock" --save "" --appendonly no >"$work/redis.log" 2>&1 &
    redis=$!
    await_socket "$work/r.sock" "$redis" "$work/redis.log"
    train "secret = \"$work/secret\"
[shared]
url = \"redis+unix://$work/r.sock\"
timeout_ms = 1000
hosts = 3" --route login --mix check-report
else
    echo "build-pgo: no redis-server: shared mode is not trained" >&2
fi

"$profdata" merge -o "$work/merged.profdata" "$work/raw"
build "-Cprofile-use=$work/merged.profdata" "$target/pgo"
echo "$(cd "$target/pgo/$host/release" && pwd)/tollgate"
