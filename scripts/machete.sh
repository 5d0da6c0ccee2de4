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

machete_version=0.9.2
machete="$tools_dir/bin/cargo-machete"
if [[ ! -x "$machete" ]] || ! "$machete" --version | grep -q "$machete_version"; then
    # Built from crates.io, like cargo-deny (common.sh).
    say "installing cargo-machete $machete_version (once per machine, about two minutes)"
    cargo_tool cargo-machete "$machete_version"
fi
[[ "${1:-}" != install ]] || exit 0

"$machete" --with-metadata
