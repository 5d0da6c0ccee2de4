#!/usr/bin/env bash
# LocalStack 4.13.1 with the messaging stack deployed.
#
#   scripts/localstack.sh up     start LocalStack (Docker when an engine answers, else host
#                                mode), deploy infra/messaging.yaml, write its outputs and the
#                                AWS variables to .run/stack.env
#   scripts/localstack.sh down   stop what `up` started
#
# Set ORDERFLEET_LOCALSTACK_MODE=host to skip the Docker check.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

mode_file="$run_dir/localstack.mode"
compose=(docker compose -f "$root/localstack/docker-compose.yml" -p orderfleet)

up() {
    if curl -fsS --max-time 2 "$localstack_url/_localstack/health" >/dev/null 2>&1 && [[ ! -f "$mode_file" ]]; then
        say "a LocalStack already answers on 127.0.0.1:4566; deploying to it"
        echo external >"$mode_file"
    elif docker_engine_answers; then
        say "Docker engine found: starting LocalStack and PostgreSQL with docker compose"
        "${compose[@]}" up -d --wait
        echo docker >"$mode_file"
    else
        "$root/localstack/host.sh" start
        echo host >"$mode_file"
    fi
    "$root/scripts/deploy-stack.sh"
    set_env AWS_REGION "${AWS_REGION:-us-east-1}"
    set_env AWS_ACCESS_KEY_ID test
    set_env AWS_SECRET_ACCESS_KEY test
    set_env AWS_ENDPOINT_URL "$localstack_url"
}

down() {
    case "$(cat "$mode_file" 2>/dev/null || echo none)" in
    docker) "${compose[@]}" down ;;
    host) "$root/localstack/host.sh" stop ;;
    external) say "LocalStack was already running before make up; leaving it" ;;
    *) say "LocalStack was not started by make up" ;;
    esac
    rm -f "$mode_file"
}

case "${1:-}" in
up) up ;;
down) down ;;
*) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
