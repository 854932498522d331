#!/usr/bin/env bash
# A local Redis Cluster for development and tests: 3 masters, no replicas, on loopback.
#
#   scripts/redis-cluster.sh start    # up and healthy (does nothing when it already is)
#   scripts/redis-cluster.sh stop     # shut the nodes down and wipe their state
#   scripts/redis-cluster.sh status   # per-node state; exit 0 only when the cluster is healthy
#   scripts/redis-cluster.sh url      # the seed list: redis://127.0.0.1:17001,...
#
# REDIS_CLUSTER_PORTS="a b c" (default "17001 17002 17003"; each also takes port+10000 for
# the cluster bus) and REDIS_CLUSTER_DIR (default /tmp/seckill-redis-cluster) override the
# defaults; pass the same values to every command. Nothing is persisted: a stop loses the
# data. The shared Redis on 6379 is never touched: only nodes whose working directory is
# under REDIS_CLUSTER_DIR are ever shut down.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER_HOST=127.0.0.1
read -r -a CLUSTER_PORTS <<<"${REDIS_CLUSTER_PORTS:-17001 17002 17003}"
CLUSTER_DIR="${REDIS_CLUSTER_DIR:-/tmp/seckill-redis-cluster}"
CLUSTER_DIR="${CLUSTER_DIR%/}"
# Proves a directory is ours before we wipe it: REDIS_CLUSTER_DIR may name anything.
MARKER=.seckill-redis-cluster
READY_SECS=30
TOTAL_SLOTS=16384

((${#CLUSTER_PORTS[@]} >= 3)) || die "REDIS_CLUSTER_PORTS needs at least 3 ports (a cluster needs 3 masters), got '${CLUSTER_PORTS[*]}'"
for port in "${CLUSTER_PORTS[@]}"; do
    [[ $port =~ ^[0-9]+$ ]] && ((port > 0 && port + 10000 <= 65535)) ||
        die "bad port '$port' in REDIS_CLUSTER_PORTS (the bus port, port+10000, must fit too)"
done
[[ $CLUSTER_DIR == /?* ]] || die "REDIS_CLUSTER_DIR must be an absolute path other than /, got '${REDIS_CLUSTER_DIR:-}'"

node_dir() { echo "$CLUSTER_DIR/$1"; }
cli() {
    local port=$1
    shift
    timeout 5 redis-cli -h "$CLUSTER_HOST" -p "$port" "$@"
}

install_missing() {
    local pkgs=()
    command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
    command -v redis-cli >/dev/null 2>&1 || pkgs+=(redis-tools)
    if ((${#pkgs[@]} == 0)); then
        return 0
    fi
    apt_install "${pkgs[@]}"
}

# ours PORT: true when the Redis answering on PORT is one of our nodes (its working
# directory is the one we gave it), so stop never shuts down somebody else's server.
ours() {
    local dir
    dir=$(cli "$1" config get dir 2>/dev/null | tr -d '\r' | sed -n 2p) || return 1
    # Redis reports its cwd, with symlinks (e.g. a linked /tmp) resolved.
    [ -n "$dir" ] && { [ "$dir" = "$(node_dir "$1")" ] || [ "$dir" = "$(realpath -m "$(node_dir "$1")")" ]; }
}

# field PORT NAME: one field of CLUSTER INFO on that node.
field() {
    cli "$1" cluster info 2>/dev/null | tr -d '\r' | awk -F: -v k="$2" '$1 == k { print $2 }'
}

node_healthy() {
    local port=$1
    ours "$port" &&
        [ "$(field "$port" cluster_state)" = ok ] &&
        [ "$(field "$port" cluster_slots_assigned)" = "$TOTAL_SLOTS" ] &&
        [ "$(field "$port" cluster_known_nodes)" = "${#CLUSTER_PORTS[@]}" ]
}

cluster_healthy() {
    local port
    for port in "${CLUSTER_PORTS[@]}"; do
        node_healthy "$port" || return 1
    done
}

# stop_node PORT: shuts our node on PORT down; leaves a foreign server alone.
stop_node() {
    local port=$1 pid_file pid
    port_open "$port" "$CLUSTER_HOST" || return 0
    if ! ours "$port"; then
        say "redis-cluster: 127.0.0.1:$port is not one of our nodes; leaving it alone"
        return 0
    fi
    say "redis-cluster: stopping node $port"
    cli "$port" shutdown nosave >/dev/null 2>&1 || true
    if ! wait_until 10 "node $port to exit" port_closed "$port"; then
        # A node stuck (e.g. in a busy script) ignores SHUTDOWN; its pid file says who it is.
        pid_file="$(node_dir "$port")/redis.pid"
        pid=$(cat "$pid_file" 2>/dev/null || true)
        if [[ $pid =~ ^[0-9]+$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = redis-server ]; then
            say "redis-cluster: killing node $port (pid $pid)"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
}

# wipe: removes the state dir, after checking it is one we created.
wipe() {
    [ -e "$CLUSTER_DIR" ] || return 0
    if [ -n "$(ls -A "$CLUSTER_DIR" 2>/dev/null)" ] && [ ! -e "$CLUSTER_DIR/$MARKER" ]; then
        die "$CLUSTER_DIR is not empty and was not made by this script; refusing to wipe it (set REDIS_CLUSTER_DIR)"
    fi
    rm -rf -- "$CLUSTER_DIR"
}

stop_all() {
    local port
    for port in "${CLUSTER_PORTS[@]}"; do
        stop_node "$port"
    done
    wipe
}

start_node() {
    local port=$1 dir
    dir=$(node_dir "$port")
    mkdir -p "$dir"
    # 9>&-: a daemon that inherited the lock fd would hold the lock for as long as it runs.
    redis-server \
        --bind "$CLUSTER_HOST" --port "$port" \
        --daemonize yes --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
        --cluster-enabled yes --cluster-config-file "$dir/nodes.conf" --cluster-node-timeout 5000 \
        --save "" --appendonly no >/dev/null 9>&- ||
        die "redis-server on port $port did not start; see $dir/redis.log"
}

node_answers() { [ "$(cli "$1" ping 2>/dev/null)" = PONG ]; }
port_closed() { ! port_open "$1" "$CLUSTER_HOST"; }

start() {
    install_missing
    if cluster_healthy; then
        say "redis-cluster: already up on ports ${CLUSTER_PORTS[*]}"
        return 0
    fi
    say "redis-cluster: (re)creating on ports ${CLUSTER_PORTS[*]} in $CLUSTER_DIR"
    stop_all

    local port seeds=()
    for port in "${CLUSTER_PORTS[@]}"; do
        port_open "$port" "$CLUSTER_HOST" && die "port $port is taken by something that is not our node"
        port_open $((port + 10000)) "$CLUSTER_HOST" && die "cluster bus port $((port + 10000)) (port $port + 10000) is taken"
        seeds+=("$CLUSTER_HOST:$port")
    done
    mkdir -p "$CLUSTER_DIR"
    touch "$CLUSTER_DIR/$MARKER"
    for port in "${CLUSTER_PORTS[@]}"; do
        start_node "$port"
    done
    for port in "${CLUSTER_PORTS[@]}"; do
        wait_until "$READY_SECS" "redis node $port" node_answers "$port" ||
            die "node $port does not answer; see $(node_dir "$port")/redis.log"
    done

    if ! redis-cli --cluster create "${seeds[@]}" --cluster-replicas 0 --cluster-yes \
        >"$CLUSTER_DIR/create.log" 2>&1; then
        cat "$CLUSTER_DIR/create.log" >&2
        die "redis-cli --cluster create failed"
    fi
    # create returns once the nodes agree on the config; every node must also have
    # heard of all slots before a client that picks any seed sees a working cluster.
    wait_until "$READY_SECS" "redis cluster (cluster_state:ok, $TOTAL_SLOTS slots on every node)" cluster_healthy || {
        status >&2 || true
        die "cluster not healthy; logs in $CLUSTER_DIR/*/redis.log"
    }
    say "redis-cluster: ready: $(url)"
}

status() {
    local port state=0
    for port in "${CLUSTER_PORTS[@]}"; do
        if ! node_answers "$port"; then
            echo "$port: down"
            state=1
        elif ! ours "$port"; then
            echo "$port: answers, but is not our node (working dir is not $(node_dir "$port"))"
            state=1
        else
            echo "$port: cluster_state:$(field "$port" cluster_state) slots_assigned:$(field "$port" cluster_slots_assigned)/$TOTAL_SLOTS known_nodes:$(field "$port" cluster_known_nodes)/${#CLUSTER_PORTS[@]}"
            node_healthy "$port" || state=1
        fi
    done
    if ((state == 0)); then
        echo "cluster: ok"
    else
        echo "cluster: not ok"
    fi
    return "$state"
}

url() {
    local port out=()
    for port in "${CLUSTER_PORTS[@]}"; do
        out+=("redis://$CLUSTER_HOST:$port")
    done
    (
        IFS=,
        echo "${out[*]}"
    )
}

usage() {
    echo "usage: $0 start|stop|status|url" >&2
    exit 2
}

(($# == 1)) || usage
case $1 in
start | stop)
    # Two callers starting (or one starting, one stopping) at once would fight over the
    # same ports and directory; the lock lives beside the dir because stop wipes the dir.
    exec 9>"$CLUSTER_DIR.lock"
    flock -w 120 9 || die "another redis-cluster.sh holds $CLUSTER_DIR.lock"
    if [ "$1" = start ]; then
        start
    else
        stop_all
        say "redis-cluster: stopped"
    fi
    ;;
status)
    command -v redis-cli >/dev/null 2>&1 || die "redis-cli not found (run: $0 start)"
    status
    ;;
url) url ;;
*) usage ;;
esac
