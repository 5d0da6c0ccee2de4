#!/usr/bin/env bash
# Schemathesis, the OpenAPI fuzzer the contract test runs against a live intake
# (tests/e2e/contract.rs): pinned, in a virtualenv of its own in the cache, made once per
# machine (PyPI). Arguments go to `schemathesis` as they are.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

venv=$(tool_venv schemathesis 4.32.5 schemathesis)
exec "$venv/bin/schemathesis" "$@"
