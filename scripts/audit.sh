#!/usr/bin/env bash
# The dependency check of `make test`: cargo-deny over Cargo.lock against deny.toml —
# known-vulnerable, unmaintained or yanked crates (the RustSec advisory database), a second
# version of a crate, licenses outside the allowed list, crates from anywhere but crates.io.
#
# These machines reach crates.io but not GitHub, so the advisory database cannot be fetched:
# the snapshot in deny/ (RustSec advisory-db at bf5c0d2, 2026-08-21) is put where cargo-deny
# keeps its databases, unless one is there already, and cargo-deny runs with --offline. With
# internet, `cargo deny check` (no --offline) fetches the live database into the same place.
#
#   scripts/audit.sh            install cargo-deny if missing, then check
#   scripts/audit.sh install    only install it (scripts/tools.sh)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"

# Built from crates.io (no prebuilt binaries reach these machines), without LTO (common.sh).
deny=$(ensure_cargo_tool cargo-deny 0.20.2)
[[ "${1:-}" != install ]] || exit 0

# cargo-deny's directory for the default database (advisory-db, hashed from its URL).
db="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs/advisory-db-3157b0e258782691"
if [[ ! -d "$db/.git" ]]; then
    say "unpacking the RustSec advisory database snapshot (2026-08-21) into $db"
    rm -rf "$db" && mkdir -p "$db"
    tar -xzf deny/rustsec-advisory-db.tar.gz -C "$db" --strip-components=1
    # cargo-deny reads the database's age from its git history: the snapshot's own date.
    (cd "$db" && git init -q && git add -A &&
        GIT_AUTHOR_DATE=2026-08-21T00:00:00Z GIT_COMMITTER_DATE=2026-08-21T00:00:00Z \
            git -c user.name=snapshot -c user.email=snapshot@localhost commit -q -m "RustSec advisory-db bf5c0d2")
fi

# cargo-deny reads the crate graph of every target, so every crate must be downloaded.
cargo fetch --locked --quiet
"$deny" --offline check --show-stats
