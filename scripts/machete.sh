#!/usr/bin/env bash
# The unused-dependency check of `make test`: cargo-machete over every crate's Cargo.toml, so
# no crate lists a dependency its code does not use. It reads each crate's code for the names
# its dependencies are used by; `--with-metadata` takes those names from cargo (async-stripe's
# crates are used as `stripe`, `stripe_core`, …), not guessed from the package names.
#
#   scripts/machete.sh            install cargo-machete if missing, then check
#   scripts/machete.sh install    only install it (scripts/tools.sh)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"

# Built from crates.io, like cargo-deny (common.sh).
machete=$(ensure_cargo_tool cargo-machete 0.9.2)
[[ "${1:-}" != install ]] || exit 0

"$machete" --with-metadata
