#!/usr/bin/env bash
# bench/compare.sh — Baton side by side with MariaDB, PostgreSQL and a three-member etcd cluster,
# the same workloads in the same run (issue 6). See bench/README.md.
#
# Installs the peers from Debian's packages when missing, starts private durable instances of
# them on loopback (never the system services), builds Baton and the peer driver in release,
# runs every (workload, clients, system) cell with a bounded time each, writes the raw JSON lines
# to bench/results/<date>.jsonl and regenerates the section of docs/benchmarks.md between
# <!-- compare:begin --> and <!-- compare:end -->. Every server is stopped at the end, also on
# error or Ctrl-C, and the temporary directory is removed.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: bench/compare.sh [--duration 20s] [--warmup 3s] [--clients "1 16 64"]
                        [--workloads "permit-uniform permit-hot handoff queue-claim mixed-read"]
                        [--systems "baton mariadb postgres etcd"] [--queue-tasks 100000]
                        [--quick] [--no-docs]

  --quick     a tiny matrix to check that everything works: 2 s runs after 1 s of warm-up,
              16 clients, 10,000 queued tasks (figures meaningless; the docs section says so)
  --no-docs   write bench/results/<date>.jsonl but leave docs/benchmarks.md alone
Durations are humantime-like: 500ms, 20s, 2m. Ports (loopback): MariaDB $COMPARE_MARIADB_PORT
(13306), PostgreSQL $COMPARE_POSTGRES_PORT (15432), etcd members 12379/22379/32379 (peers +1).
EOF
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ORIGINAL_ARGS=("$@")

DURATION=20s
WARMUP=3s
CLIENTS="1 16 64"
WORKLOADS="permit-uniform permit-hot handoff queue-claim mixed-read"
SYSTEMS="baton mariadb postgres etcd"
QUEUE_TASKS=100000
QUICK=0
DOCS=1
while (($#)); do
    case "$1" in
    --duration) DURATION=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --workloads) WORKLOADS=$2; shift 2 ;;
    --systems) SYSTEMS=$2; shift 2 ;;
    --queue-tasks) QUEUE_TASKS=$2; shift 2 ;;
    --quick) QUICK=1; DURATION=2s; WARMUP=1s; CLIENTS=16; QUEUE_TASKS=10000; shift ;;
    --no-docs) DOCS=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

MARIADB_PORT=${COMPARE_MARIADB_PORT:-13306}
POSTGRES_PORT=${COMPARE_POSTGRES_PORT:-15432}
ETCD_CLIENT_PORTS=(12379 22379 32379)
ETCD_PEER_PORTS=(12380 22380 32380)

# Never fails: a closed stderr (`| tee` killed by Ctrl-C, a hung-up terminal) must not stop the
# clean-up below before it has stopped the servers.
log() { { printf '[compare %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; } 2>/dev/null || true; }
die() { log "error: $*"; exit 1; }

has() { [[ " $SYSTEMS " == *" $1 "* ]]; }

# "20s", "500ms", "2m" -> whole seconds, rounded up (the bound of a run, not its length).
seconds() {
    local d=$1
    [[ $d =~ ^[0-9]+(ms|s|m)$ ]] || die "cannot read the duration $d (use e.g. 500ms, 20s, 2m)"
    case "$d" in
    *ms) echo $(((${d%ms} + 999) / 1000)) ;;
    *s) echo "${d%s}" ;;
    *m) echo $((${d%m} * 60)) ;;
    esac
}
DURATION_S=$(seconds "$DURATION")
WARMUP_S=$(seconds "$WARMUP")

# ---------------------------------------------------------------------------------------------
# Clean-up: every server and run this script started, by pid, on any exit.

WORK=""
MARIADB_PID=""
POSTGRES_DATA=""
ETCD_PIDS=()
CURRENT_RUN=""
POLICY_RC_CREATED=0

stop_pid() { # pid seconds: TERM, wait up to `seconds`, then KILL
    local pid=$1 limit=$2 waited=0
    kill -TERM "$pid" 2>/dev/null || return 0
    while kill -0 "$pid" 2>/dev/null && ((waited < limit * 10)); do
        sleep 0.1
        waited=$((waited + 1))
    done
    kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM HUP
    # Everything below runs whatever fails: the servers must stop.
    set +e
    trap '' PIPE
    if [[ -n "$CURRENT_RUN" ]]; then
        # A run in flight: `timeout` leads its own process group (Baton's nodes included).
        kill -TERM -- "-$CURRENT_RUN" 2>/dev/null || true
        # A bench stops and removes its own cluster on TERM: give it the time to.
        local waited=0
        while kill -0 -- "-$CURRENT_RUN" 2>/dev/null && ((waited < 100)); do
            sleep 0.1
            waited=$((waited + 1))
        done
        kill -KILL -- "-$CURRENT_RUN" 2>/dev/null || true
    fi
    if [[ -n "$MARIADB_PID" ]]; then
        log "stopping MariaDB"
        stop_pid "$MARIADB_PID" 60
    fi
    if [[ -n "$POSTGRES_DATA" ]]; then
        log "stopping PostgreSQL"
        as_db_user postgres "$PG_BIN/pg_ctl" -D "$POSTGRES_DATA" -m fast -t 60 stop >/dev/null 2>&1 ||
            { [[ -f "$POSTGRES_DATA/postmaster.pid" ]] && stop_pid "$(head -1 "$POSTGRES_DATA/postmaster.pid")" 10; } || true
    fi
    if ((${#ETCD_PIDS[@]})); then
        log "stopping etcd"
        for pid in "${ETCD_PIDS[@]}"; do stop_pid "$pid" 30; done
    fi
    if ((POLICY_RC_CREATED)); then as_root rm -f /usr/sbin/policy-rc.d; fi
    if [[ -n "$WORK" && -d "$WORK" ]]; then rm -rf "$WORK"; fi
    exit "$status"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM
trap 'log "hung up"; exit 129' HUP

# ---------------------------------------------------------------------------------------------
# Packages (Debian's), installed only when missing, without starting their system services.

ROOT_USER=0
[[ $(id -u) == 0 ]] && ROOT_USER=1

as_root() {
    if ((ROOT_USER)); then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        die "need root (or sudo) to run: $*"
    fi
}

install_missing() {
    local missing=()
    if has mariadb; then
        command -v mariadbd >/dev/null || [[ -x /usr/sbin/mariadbd ]] || missing+=(mariadb-server)
        command -v mariadb >/dev/null || missing+=(mariadb-client)
    fi
    if has postgres; then
        compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || missing+=(postgresql)
    fi
    if has etcd; then
        command -v etcd >/dev/null || missing+=(etcd-server)
        command -v etcdctl >/dev/null || missing+=(etcd-client)
        command -v protoc >/dev/null || missing+=(protobuf-compiler)
    elif has mariadb || has postgres; then
        command -v protoc >/dev/null || missing+=(protobuf-compiler) # the driver links etcd-client
    fi
    # etcd-client's protos import Google's well-known types, which protoc alone does not ship.
    [[ -e /usr/include/google/protobuf/descriptor.proto ]] || missing+=(libprotobuf-dev)
    command -v python3 >/dev/null || missing+=(python3)
    ((${#missing[@]})) || return 0
    log "installing from Debian's packages: ${missing[*]}"
    # Package scripts must not start the system services: we run private instances.
    # Also under sudo: the policy file is written as root either way.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        as_root sh -c "printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d"
        POLICY_RC_CREATED=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    if ((POLICY_RC_CREATED)); then as_root rm -f /usr/sbin/policy-rc.d; POLICY_RC_CREATED=0; fi
}

# Database servers refuse to run as root: as root, run them as their packages' own users.
as_db_user() { # user cmd...
    local user=$1
    shift
    if ((ROOT_USER)); then (cd / && runuser -u "$user" -- "$@"); else "$@"; fi
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_until() { # seconds description cmd...: polls cmd every 0.2 s
    local limit=$1 what=$2 tries=0
    shift 2
    until "$@" >/dev/null 2>&1; do
        tries=$((tries + 1))
        ((tries < limit * 5)) || die "$what did not come up within ${limit}s (logs in $WORK)"
        sleep 0.2
    done
}

# ---------------------------------------------------------------------------------------------
# The peers: private durable instances in $WORK, on loopback.

start_mariadb() {
    local dir=$WORK/mariadb user
    user=$(id -un)
    ((ROOT_USER)) && user=mysql
    mkdir -p "$dir/data"
    ((ROOT_USER)) && chown -R mysql: "$dir"
    port_busy "$MARIADB_PORT" && die "port $MARIADB_PORT is in use (set COMPARE_MARIADB_PORT)"
    # Binary log off: one server, no replica to feed, so sync_binlog does not apply.
    cat >"$dir/my.cnf" <<EOF
[mysqld]
datadir = $dir/data
socket = $dir/mysqld.sock
pid-file = $dir/mysqld.pid
log-error = $dir/error.log
port = $MARIADB_PORT
bind-address = 127.0.0.1
skip-name-resolve
skip-log-bin
innodb_flush_log_at_trx_commit = 1
innodb_doublewrite = ON
innodb_flush_method = O_DIRECT
innodb_buffer_pool_size = 1G
innodb_log_file_size = 512M
innodb_log_buffer_size = 64M
max_connections = 256
thread_cache_size = 128
table_open_cache = 1024
EOF
    MARIADB_SETTINGS=$(sed -n '/^\[mysqld\]/,$p' "$dir/my.cnf" | grep -v -e "^datadir" -e "^socket" -e "^pid-file" -e "^log-error")
    log "MariaDB: initialising $dir"
    mariadb-install-db --defaults-file="$dir/my.cnf" --user="$user" --skip-test-db \
        >"$dir/install.log" 2>&1 || die "mariadb-install-db failed (see $dir/install.log)"
    setsid "$(command -v mariadbd || echo /usr/sbin/mariadbd)" --defaults-file="$dir/my.cnf" --user="$user" \
        >"$dir/stdout.log" 2>&1 </dev/null &
    MARIADB_PID=$!
    wait_until 60 MariaDB mariadb-admin --socket="$dir/mysqld.sock" -u "$(id -un)" ping
    mariadb --socket="$dir/mysqld.sock" -u "$(id -un)" <<'EOF'
CREATE DATABASE bench;
CREATE USER 'bench'@'127.0.0.1' IDENTIFIED BY 'bench';
GRANT ALL ON bench.* TO 'bench'@'127.0.0.1';
EOF
    MARIADB_VERSION=$(mariadb --socket="$dir/mysqld.sock" -u "$(id -un)" -N -e 'SELECT VERSION()')
    log "MariaDB $MARIADB_VERSION on 127.0.0.1:$MARIADB_PORT"
}

start_postgres() {
    local dir=$WORK/postgres
    PG_BIN=$(compgen -G '/usr/lib/postgresql/*/bin' | sort -V | tail -1)
    [[ -x "$PG_BIN/postgres" ]] || die "no PostgreSQL server under /usr/lib/postgresql"
    port_busy "$POSTGRES_PORT" && die "port $POSTGRES_PORT is in use (set COMPARE_POSTGRES_PORT)"
    mkdir -p "$dir"
    ((ROOT_USER)) && chown postgres: "$dir"
    log "PostgreSQL: initialising $dir"
    as_db_user postgres "$PG_BIN/initdb" -D "$dir/data" -U bench --auth=trust --encoding=UTF8 \
        >"$dir/initdb.log" 2>&1 || die "initdb failed (see $dir/initdb.log)"
    POSTGRES_SETTINGS="listen_addresses = '127.0.0.1'
port = $POSTGRES_PORT
fsync = on
synchronous_commit = on
full_page_writes = on
wal_sync_method = fdatasync
max_connections = 256
shared_buffers = 1GB
wal_buffers = 64MB
max_wal_size = 8GB
checkpoint_timeout = 30min
log_min_messages = warning"
    {
        echo "$POSTGRES_SETTINGS"
        echo "unix_socket_directories = '$dir'"
    } | as_db_user postgres tee -a "$dir/data/postgresql.conf" >/dev/null
    POSTGRES_DATA=$dir/data
    as_db_user postgres "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
        >/dev/null || die "PostgreSQL did not start (see $dir/server.log)"
    "$PG_BIN/createdb" -h 127.0.0.1 -p "$POSTGRES_PORT" -U bench bench
    POSTGRES_VERSION=$("$PG_BIN/psql" -h 127.0.0.1 -p "$POSTGRES_PORT" -U bench -d bench -Atc 'SHOW server_version')
    log "PostgreSQL $POSTGRES_VERSION on 127.0.0.1:$POSTGRES_PORT"
}

start_etcd() {
    local dir=$WORK/etcd cluster="" i
    mkdir -p "$dir"
    for i in 0 1 2; do
        port_busy "${ETCD_CLIENT_PORTS[$i]}" && die "port ${ETCD_CLIENT_PORTS[$i]} is in use"
        port_busy "${ETCD_PEER_PORTS[$i]}" && die "port ${ETCD_PEER_PORTS[$i]} is in use"
        cluster+="${cluster:+,}m$i=http://127.0.0.1:${ETCD_PEER_PORTS[$i]}"
    done
    # Default durability: every Raft batch is fsynced on a quorum before it is acknowledged.
    ETCD_SETTINGS="three members on 127.0.0.1 (clients ${ETCD_CLIENT_PORTS[*]}), default durability (WAL fsync per batch), --quota-backend-bytes=8589934592, --max-txn-ops=128 (default), --snapshot-count=100000 (default), --logger=zap --log-level=warn"
    for i in 0 1 2; do
        setsid etcd --name "m$i" --data-dir "$dir/m$i" \
            --listen-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORTS[$i]}" \
            --advertise-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORTS[$i]}" \
            --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORTS[$i]}" \
            --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORTS[$i]}" \
            --initial-cluster "$cluster" --initial-cluster-token baton-compare \
            --initial-cluster-state new --quota-backend-bytes 8589934592 \
            --logger zap --log-level warn >"$dir/m$i.log" 2>&1 </dev/null &
        ETCD_PIDS+=($!)
    done
    ETCD_ENDPOINTS=$(printf '127.0.0.1:%s,' "${ETCD_CLIENT_PORTS[@]}")
    ETCD_ENDPOINTS=${ETCD_ENDPOINTS%,}
    wait_until 60 etcd env ETCDCTL_API=3 etcdctl --endpoints="$ETCD_ENDPOINTS" endpoint health
    ETCD_VERSION=$(etcd --version | sed -n 's/^etcd Version: //p')
    log "etcd $ETCD_VERSION, three members at $ETCD_ENDPOINTS"
}

# ---------------------------------------------------------------------------------------------
# One bounded run: `timeout` leads its own process group, so a run that overstays is stopped
# whole (Baton's three nodes with it), and the clean-up can stop it on Ctrl-C.

run_bounded() { # limit out err cmd...
    local limit=$1 out=$2 err=$3 status=0
    shift 3
    timeout -k 10 "$limit" "$@" >"$out" 2>"$err" </dev/null &
    CURRENT_RUN=$!
    wait "$CURRENT_RUN" || status=$?
    CURRENT_RUN=""
    return "$status"
}

RESULTS=""
record_run() { # system workload clients
    local system=$1 workload=$2 clients=$3 limit out err status=0
    # Set-up (seeding, a queue of 100,000 tasks) is not measured but must be bounded too.
    limit=$((WARMUP_S + DURATION_S + 120))
    [[ $workload == queue-claim ]] && limit=$((limit + 240))
    out=$WORK/run.out
    err=$WORK/logs/$system-$workload-$clients.err
    local common=(--workload "$workload" --clients "$clients" --duration "$DURATION" --warmup "$WARMUP" --queue-tasks "$QUEUE_TASKS" --json)
    log "$system $workload clients=$clients"
    case "$system" in
    # Its own cluster's data under $WORK, so the clean-up removes it even after a KILL.
    baton) TMPDIR=$WORK run_bounded "$limit" "$out" "$err" "$BATON" bench "${common[@]}" || status=$? ;;
    mariadb) run_bounded "$limit" "$out" "$err" "$PEERS" --target mariadb --mariadb-url "mysql://bench:bench@127.0.0.1:$MARIADB_PORT/bench" "${common[@]}" || status=$? ;;
    postgres) run_bounded "$limit" "$out" "$err" "$PEERS" --target postgres --postgres "host=127.0.0.1 port=$POSTGRES_PORT user=bench dbname=bench" "${common[@]}" || status=$? ;;
    etcd) run_bounded "$limit" "$out" "$err" "$PEERS" --target etcd --etcd-endpoints "$ETCD_ENDPOINTS" "${common[@]}" || status=$? ;;
    esac
    # One JSON line per cell, tagged with the system; a failed cell is recorded as such.
    python3 - "$system" "$workload" "$clients" "$status" "$out" "$err" >>"$RESULTS" <<'EOF'
import json, sys
system, workload, clients, status, out, err = sys.argv[1:]
lines = [l for l in open(out, encoding="utf-8", errors="replace") if l.strip().startswith("{")]
if status == "0" and lines:
    run = json.loads(lines[-1])
    run["system"] = system
else:
    tail = open(err, encoding="utf-8", errors="replace").read().strip().splitlines()[-3:]
    why = "timed out" if status == "124" else f"exit {status}"
    run = {"system": system, "workload": workload, "clients": int(clients),
           "error": f"{why}: {' | '.join(tail)}"}
print(json.dumps(run))
EOF
    tail -1 "$RESULTS" >&2
}

# ---------------------------------------------------------------------------------------------

main() {
    cd "$ROOT"
    for system in $SYSTEMS; do
        case "$system" in baton | mariadb | postgres | etcd) ;; *) die "unknown system $system" ;; esac
    done
    install_missing

    log "building Baton and the peer driver (release)"
    # Where cargo builds, as cargo resolves it (environment, config files): never an older
    # binary left at the usual place.
    local target
    target=$(cargo metadata --no-deps --format-version 1 | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    [[ -n $target ]] || die "cannot find cargo's target directory"
    if has baton; then cargo build --release -p baton-node --bin baton >&2; fi
    BATON=$target/release/baton
    # Named now, as built: the tree may change while the run goes on.
    if commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null); then
        BATON_BUILT="commit $commit"
        git -C "$ROOT" diff --quiet HEAD -- . ':!bench/results' ':!docs' || BATON_BUILT+=" + local changes"
    else
        BATON_BUILT="not a git checkout"
    fi
    PEERS=$ROOT/bench/peers/target/release/peers-bench
    if has mariadb || has postgres || has etcd; then
        CARGO_TARGET_DIR=$ROOT/bench/peers/target cargo build --release --manifest-path "$ROOT/bench/peers/Cargo.toml" >&2
    fi

    WORK=$(mktemp -d "${TMPDIR:-/tmp}/baton-compare.XXXXXX")
    chmod 755 "$WORK" # the database users must reach their directories
    mkdir -p "$WORK/logs"
    MARIADB_VERSION="" POSTGRES_VERSION="" ETCD_VERSION=""
    MARIADB_SETTINGS="" POSTGRES_SETTINGS="" ETCD_SETTINGS=""
    has mariadb && start_mariadb
    has postgres && start_postgres
    has etcd && start_etcd

    local stamp
    stamp=$(date -u +%Y-%m-%dT%H%M%SZ)
    mkdir -p "$ROOT/bench/results"
    RESULTS=$ROOT/bench/results/$stamp.jsonl
    : >"$RESULTS"
    # Systems interleave inside every cell, so a noisy moment hits them alike.
    for workload in $WORKLOADS; do
        for clients in $CLIENTS; do
            for system in $SYSTEMS; do
                record_run "$system" "$workload" "$clients"
            done
        done
    done
    log "raw results: ${RESULTS#"$ROOT"/}"

    write_meta "$stamp" >"$WORK/meta.json"
    cp "$WORK/meta.json" "${RESULTS%.jsonl}.meta.json"
    local docs=()
    ((DOCS)) && docs=(--doc "$ROOT/docs/benchmarks.md")
    python3 "$ROOT/bench/report.py" --results "$RESULTS" --meta "$WORK/meta.json" "${docs[@]}"
}

# What the report needs besides the figures: versions, settings, the machine, the command.
write_meta() {
    local stamp=$1 command=bench/compare.sh baton driver disk fsync
    if ((${#ORIGINAL_ARGS[@]})); then command+=$(printf ' %q' "${ORIGINAL_ARGS[@]}"); fi
    baton="$("$BATON" --version 2>/dev/null || echo baton), $BATON_BUILT"
    driver=$(awk '/^name = "(mysql_async|tokio-postgres|etcd-client)"/ { n = $3; getline; printf "%s %s, ", n, $3 }' \
        "$ROOT/bench/peers/Cargo.lock" | tr -d '"' | sed 's/, $//')
    disk="$(findmnt -no SOURCE,FSTYPE -T "$WORK" 2>/dev/null | sed -n 1p | tr -s ' ') ($(df -h --output=size "$WORK" | tail -1 | tr -d ' ') total)"
    # The disk's cost of one durable write: 200 x (4 KiB write + fdatasync) where the data lives.
    fsync=$(python3 - "$WORK" <<'EOF'
import os, statistics, sys, time
path = os.path.join(sys.argv[1], "fsync-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
samples = []
for _ in range(200):
    started = time.perf_counter()
    os.write(fd, b"x" * 4096)
    os.fdatasync(fd)
    samples.append((time.perf_counter() - started) * 1000)
os.close(fd)
os.unlink(path)
samples.sort()
print(f"{statistics.median(samples):.2f} ms median, {samples[197]:.2f} ms p99")
EOF
)
    local meta=(
        date "$stamp" quick "$QUICK" command "$command"
        duration "$DURATION" warmup "$WARMUP" queue_tasks "$QUEUE_TASKS"
        baton_version "$baton" driver "$driver"
        mariadb_version "$MARIADB_VERSION" postgres_version "$POSTGRES_VERSION" etcd_version "$ETCD_VERSION"
        mariadb_settings "$MARIADB_SETTINGS" postgres_settings "$POSTGRES_SETTINGS" etcd_settings "$ETCD_SETTINGS"
        nproc "$(nproc)"
        memory "$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
        cpu "$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^model name[[:space:]]*: //')"
        kernel "$(uname -r)" disk "$disk" fsync_ms "$fsync"
    )
    python3 -c 'import json, sys; a = sys.argv[1:]; print(json.dumps(dict(zip(a[::2], a[1::2])), indent=1, sort_keys=True))' "${meta[@]}"
}

main
