#!/usr/bin/env bash
# Stops the cluster deploy/up.sh started and removes its containers and network. The volumes —
# every node's data — are kept unless --delete-data is given, so stopping to free the ports and
# starting again with up.sh resumes the cluster. Safe to run again.
#
#   deploy/down.sh [--delete-data]      (BATON_PROJECT selects the project, default baton)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/compose.sh"

case ${1:-} in
    "")
        compose down --remove-orphans
        echo "down.sh: compose project $project stopped; its data volumes are kept (--delete-data removes them)"
        ;;
    --delete-data)
        compose down --volumes --remove-orphans
        echo "down.sh: compose project $project removed with its data volumes"
        ;;
    *)
        echo "usage: $0 [--delete-data]" >&2
        exit 2
        ;;
esac
