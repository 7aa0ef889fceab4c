#!/usr/bin/env bash
# Stops the cluster deploy/up.sh started and removes its containers, network and — unless
# --keep-data is given — its volumes, that is every node's data. Safe to run again.
#
#   deploy/down.sh [--keep-data]        (BATON_PROJECT selects the project, default baton)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/compose.sh"

case ${1:-} in
    "") compose down --volumes --remove-orphans ;;
    --keep-data) compose down --remove-orphans ;;
    *)
        echo "usage: $0 [--keep-data]" >&2
        exit 2
        ;;
esac
echo "down.sh: compose project $project removed${1:+ (volumes kept)}"
