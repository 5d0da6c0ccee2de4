#!/usr/bin/env bash
# Runs a command with the variables `make up` wrote to .run/stack.env (database, LocalStack,
# queue URLs, topic ARN, stripe-sim, the local JWT secret).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[[ -f "$env_file" ]] || die "no ${env_file#"$root/"}: run 'make up' first"
set -a
# shellcheck disable=SC1090
source "$env_file"
set +a
exec "$@"
