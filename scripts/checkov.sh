#!/usr/bin/env bash
# The infrastructure scan of `make test`: checkov over infra/ (CloudFormation), offline. Every
# finding is fixed, or skipped in the template next to the resource with a one-line reason.
# checkov lives in a virtualenv of its own in the cache, made once per machine (PyPI).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"

version=3.3.30
venv="${XDG_CACHE_HOME:-$HOME/.cache}/orderfleet/checkov-venv-$version"
if [[ ! -x "$venv/bin/checkov" ]]; then
    say "installing checkov $version into $venv (once per machine)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "checkov==$version"
fi
# It cannot reach its vendor's API from here and says so on stderr; the scan itself is local.
"$venv/bin/checkov" --directory infra --framework cloudformation --compact --quiet 2>/dev/null
