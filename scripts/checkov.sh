#!/usr/bin/env bash
# The infrastructure scan of `make test`: checkov over infra/ (CloudFormation), offline. Every
# finding is fixed, or skipped in the template next to the resource with a one-line reason.
# checkov lives in a virtualenv of its own in the cache, made once per machine (PyPI).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"

venv=$(tool_venv checkov 3.3.30 checkov)
# `scripts/checkov.sh --version`: install it (scripts/tools.sh) and print its version.
[[ "${1:-}" != --version ]] || exec "$venv/bin/checkov" --version
# It cannot reach its vendor's API from here and says so on stderr; the scan itself is local.
"$venv/bin/checkov" --directory infra --framework cloudformation --compact --quiet 2>/dev/null
