#!/usr/bin/env bash
# Starts the three-node Baton cluster of deploy/docker-compose.yml on this Docker host, or
# updates it: builds the release binary, builds the image FROM scratch (deploy/image.sh), starts
# the containers, lets the `init` service form the cluster, and waits until `baton status` names
# a leader. Safe to run again: the data lives in named volumes, and `baton cluster init` on a
# formed cluster answers ALREADY_INITIALIZED, which counts as done.
#
# Environment (all optional):
#   BATON_PROJECT         compose project name                     [baton]
#   BATON_IMAGE           image tag to build and run                [baton:local]
#   BATON_PORT_1..3       host ports of node1..node3               [7001, 7002, 7003]
#   BATON_BIND            host address the ports are published on [127.0.0.1]
#   BATON_ADVERTISE_HOST  host part of the addresses nodes advertise to clients [127.0.0.1]
#   CARGO_TARGET_DIR      where cargo builds (as cargo resolves it)  [<repo>/target]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
source "$here/compose.sh"

export BATON_IMAGE=${BATON_IMAGE:-baton:local}
advertise=${BATON_ADVERTISE_HOST:-127.0.0.1}
endpoints="$advertise:${BATON_PORT_1:-7001},$advertise:${BATON_PORT_2:-7002},$advertise:${BATON_PORT_3:-7003}"

echo "up.sh: building the release binary"
(cd "$root" && cargo build --release --bin baton)
# Where cargo put it, as cargo says (CARGO_TARGET_DIR, CARGO_BUILD_TARGET_DIR or a config file's
# build.target-dir, relative to the workspace): never an older binary left at the usual place.
target=$(cd "$root" && cargo metadata --no-deps --format-version 1 |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[[ -n $target ]] || { echo "up.sh: cannot find cargo's target directory" >&2; exit 1; }
baton="$target/release/baton"
"$here/image.sh" "$baton" "$BATON_IMAGE"

down=""
[[ $project != baton ]] && down="BATON_PROJECT=$project "
# From here on a failure leaves the containers as they are, to be looked at; say how to stop them.
left_up() {
    local status=$?
    if ((status != 0)); then
        echo "up.sh: the containers are left as they are for inspection" \
            "(docker ps --all --filter label=com.docker.compose.project=$project);" \
            "stop them with ${down}deploy/down.sh" >&2
    fi
}
trap left_up EXIT

# docker-compose v1 (1.29) cannot recreate a container on current Docker engines (25 and later):
# it reads the image's `ContainerConfig`, which they no longer report, and fails with
# `KeyError: 'ContainerConfig'`. So under v1 the old containers go first; `down` without
# --volumes keeps every node's data.
if [[ ${compose_command[0]} == docker-compose ]] && [[ -n $(docker ps --all --quiet \
    --filter "label=com.docker.compose.project=$project") ]]; then
    echo "up.sh: removing the old containers first (docker-compose v1 cannot recreate them; the data volumes stay)"
    compose down --remove-orphans
fi

echo "up.sh: starting compose project $project (${compose_command[*]})"
if ! compose up --detach --remove-orphans; then
    echo "up.sh: compose up failed; the nodes' last log lines:" >&2
    compose logs --tail 40 >&2 || true
    exit 1
fi

# The init service runs `baton cluster init` once every node is healthy, then exits (its own
# --timeout is 20 s).
init=$(docker ps --all --quiet \
    --filter "label=com.docker.compose.project=$project" \
    --filter "label=com.docker.compose.service=init" | head -n 1)
if [[ -z $init ]]; then
    echo "up.sh: compose started no init container" >&2
    exit 1
fi
# Deadlines in wall-clock seconds ($SECONDS), not in rounds: a round can take several seconds.
started=$SECONDS
deadline=$((SECONDS + 60))
state=""
while true; do
    state=$(docker inspect --format '{{.State.Status}} {{.State.ExitCode}}' "$init")
    [[ $state == exited* ]] && break
    ((SECONDS < deadline)) || break
    sleep 1
done
last_line=$(docker logs "$init" 2>&1 | tail -n 1)
case $state in
    "exited 0") echo "up.sh: $last_line" ;;
    "exited 3")
        if [[ $last_line != ALREADY_INITIALIZED* ]]; then
            echo "up.sh: baton cluster init refused: $last_line" >&2
            exit 1
        fi
        echo "up.sh: the cluster was formed before (ALREADY_INITIALIZED)"
        ;;
    exited*)
        echo "up.sh: baton cluster init did not succeed (state: $state):" >&2
        docker logs "$init" >&2
        exit 1
        ;;
    *)
        echo "up.sh: baton cluster init has not finished after $((SECONDS - started)) s" \
            "(state: $state):" >&2
        docker logs "$init" >&2
        exit 1
        ;;
esac

echo "up.sh: waiting for a leader"
started=$SECONDS
deadline=$((SECONDS + 60))
while true; do
    if "$baton" status --endpoints "$endpoints" --timeout 2s --json 2>/dev/null \
        | grep -q '"leader":[0-9]'; then
        "$baton" status --endpoints "$endpoints"
        cat <<EOT

Baton is up (compose project $project). Reach it with:
  export BATON_ENDPOINTS=$endpoints
  $baton status
  $baton ticket offer --key hello --from me --to you --reply-to me --ttl 60s --payload hi
or from Rust: baton_rpc::Client::connect(&[...these endpoints...]).
Stop it (keeping its data) with ${down}deploy/down.sh; delete the data too with --delete-data.
EOT
        exit 0
    fi
    ((SECONDS < deadline)) || break
    sleep 1
done
echo "up.sh: no leader after $((SECONDS - started)) s; logs:" >&2
compose logs --tail 40 >&2 || true
exit 1
