# Shared by the A/B scripts (spray.sh, decision_log.sh, ab.sh): one fresh
# daemon on a temp socket and state file, one `tollgate bench` run against
# it, the daemon's CPU time per request, then the daemon stopped.
#
#   bench_fresh_daemon BIN DIR CONFIG ROUTE DURATION [bench args...]
#
# BIN serves and, unless GEN names another build, drives (each build's own
# load generator speaks its own daemon's newest protocol; GEN set to the
# older build's binary drives both with one generator, for a fair A/B of
# the daemons alone); CONFIG is TOML appended to the socket and
# state lines. Prints the bench's first line and the CPU figure. With
# PIN=1 in the environment the daemon runs on CPU 0 and the load generator
# on CPU 1 (`taskset`).
bench_fresh_daemon() {
    local bin=$1 dir=$2 config=$3 route=$4 duration=$5
    shift 5
    rm -rf "$dir" && mkdir -p "$dir"
    printf 'socket = "%s/s.sock"\nstate = "%s/state.redb"\n%s\n' "$dir" "$dir" "$config" > "$dir/tollgate.toml"
    # PIN=1: the daemon on CPU 0 and the load generator on CPU 1, so
    # neither steals the other's core and a run measures the daemon's own
    # capacity on one core (less noisy than both sharing two).
    local daemon_cpu=() bench_cpu=()
    if [ -n "${PIN:-}" ]; then daemon_cpu=(taskset -c 0); bench_cpu=(taskset -c 1); fi
    "${daemon_cpu[@]}" "$bin" serve --config "$dir/tollgate.toml" > "$dir/log" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
    local line
    line=$("${bench_cpu[@]}" "${GEN:-$bin}" bench --socket "$dir/s.sock" --route "$route" --duration "$duration" "$@" | sed -n 1p)
    # The daemon's CPU time (all its threads) per request answered: less
    # at the mercy of a busy machine than throughput is.
    local ticks requests
    ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    requests=$(echo "$line" | sed -n 's/.*(\([0-9]*\) requests.*/\1/p')
    echo "$line  daemon CPU $(awk -v t="$ticks" -v r="$requests" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.2f", t / hz * 1e6 / r }') us/request"
    kill "$pid" && wait "$pid" 2>/dev/null || true
}

# Shared mode's scripts (shared.sh, shared-replay.sh):
# a private redis-server on DIR/r.sock, answering before this returns;
# its pid in REDIS_PID. The servers' standard output goes nowhere here,
# so that none holds open a pipe the script's output goes through.
start_redis() {
    local dir=$1
    redis-server --port 0 --unixsocket "$dir/r.sock" --unixsocketperm 700 --dir "$dir" \
        --save '' --appendonly no --daemonize no --logfile "$dir/redis.log" > /dev/null &
    REDIS_PID=$!
    for _ in $(seq 100); do redis-cli -s "$dir/r.sock" PING >/dev/null 2>&1 && break; sleep 0.05; done
}

# A daemon BIN serving on DIR/t.sock with DIR/state.redb and CONFIG (TOML)
# as its config file, its log in DIR/log, listening before this returns;
# its pid in DAEMON_PID.
start_serving() {
    local bin=$1 dir=$2
    mkdir -p "$dir"
    printf '%s\n' "$3" > "$dir/tollgate.toml"
    TOLLGATE_LOG=warn "$bin" serve --socket "$dir/t.sock" --state "$dir/state.redb" --config "$dir/tollgate.toml" \
        > /dev/null 2> "$dir/log" &
    DAEMON_PID=$!
    for _ in $(seq 200); do [ -S "$dir/t.sock" ] && break; sleep 0.05; done
}

# A private redis-server in DIR and the daemon BIN beside it, with
# [shared] pointing at it and patient (timeout_ms = 1000: the store
# decides every answer, as shared.sh's patient daemon), SECRET its key
# file; both appended to PIDS (with_temp_dir's). Their pids in REDIS_PID
# and DAEMON_PID.
start_store_and_daemon() { # bin, dir, secret
    start_redis "$2"
    PIDS+=("$REDIS_PID")
    start_serving "$1" "$2" "secret = \"$3\"
[shared]
url = \"redis+unix://$2/r.sock\"
timeout_ms = 1000
hosts = 3"
    PIDS+=("$DAEMON_PID")
}

# Shared mode's scripts: a temp dir in TMP (mktemp -d /tmp/PREFIX.XXXXXX)
# and the servers started for it in PIDS (the caller appends), all gone
# when the script ends: on exit, or on INT or TERM, which exit (bash would
# otherwise run the handler and carry on with the next command). A frozen
# server (SIGSTOP) is continued first, so that it can die.
with_temp_dir() {
    TMP=$(mktemp -d "/tmp/$1.XXXXXX")
    PIDS=()
    trap remove_temp_dir EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}
remove_temp_dir() {
    for pid in "${PIDS[@]}"; do
        kill -CONT "$pid" 2>/dev/null || true
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
