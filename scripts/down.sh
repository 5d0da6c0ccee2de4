#!/usr/bin/env bash
# `make down`: stops what `make up` started, and nothing else.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
mode=$(cat "$run_dir/localstack.mode" 2>/dev/null || echo none)
"$root/scripts/localstack.sh" down
# In Docker mode compose ran PostgreSQL too, and `compose down` stopped it.
[[ "$mode" == docker ]] || "$root/scripts/postgres.sh" down
