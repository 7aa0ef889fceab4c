# Sourced by up.sh and down.sh (not run on its own). Defines `compose ARGS...`: Docker Compose on
# deploy/docker-compose.yml under the project $BATON_PROJECT (default `baton`), through the v2
# plugin (`docker compose`) when it is installed, else the v1 command (`docker-compose`).

project=${BATON_PROJECT:-baton}
compose_file="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/docker-compose.yml"

if docker compose version >/dev/null 2>&1; then
    compose_command=(docker compose)
elif docker-compose version >/dev/null 2>&1; then
    compose_command=(docker-compose)
else
    echo "$(basename "$0"): neither \`docker compose\` nor \`docker-compose\` runs here" >&2
    exit 1
fi

compose() {
    "${compose_command[@]}" --project-name "$project" --file "$compose_file" "$@"
}
