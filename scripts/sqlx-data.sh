#!/usr/bin/env bash
# sqlx's offline query data, .sqlx/ (checked in): what the query macros read instead of a
# database when the code builds (.cargo/config.toml sets SQLX_OFFLINE).
#
#   scripts/sqlx-data.sh check   the data is what the migrated schema says of every statement
#                                (`make test` runs it): a stale, missing or extra file fails
#   scripts/sqlx-data.sh write   writes it anew, after a statement or a migration changed
#
# Both describe every statement against the database of `make up` (migrated): the crates with
# query macros are checked again, online, in a target directory of their own (so the build's
# artifacts stay as they are), and the macros write what they saw to a scratch directory.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

mode=${1:-}
[[ $mode == check || $mode == write ]] || die "usage: scripts/sqlx-data.sh check|write"
[[ -f "$env_file" ]] || die "no ${env_file#"$root/"}: run 'make up' first"
database_url=$(grep '^DATABASE_URL=' "$env_file" | cut -d= -f2-)

# The crates whose code has query macros.
crates=(orderfleet outbox-relay notification-worker fleetctl)
packages=()
for crate in "${crates[@]}"; do packages+=(-p "$crate"); done

seen=$(mktemp -d)
trap 'rm -rf "$seen"' EXIT
target="${CARGO_TARGET_DIR:-$root/target}/sqlx-data"
cd "$root"
# Cleaned first, so that their macros run again: cargo cannot know the database changed.
CARGO_TARGET_DIR="$target" cargo clean --quiet "${packages[@]}"
SQLX_OFFLINE=false SQLX_OFFLINE_DIR="$seen" DATABASE_URL="$database_url" \
    CARGO_TARGET_DIR="$target" cargo check --quiet --lib "${packages[@]}"

if [[ $mode == write ]]; then
    rm -rf .sqlx
    mkdir -p .sqlx
    cp "$seen"/*.json .sqlx/
    say "wrote $(ls .sqlx | wc -l) statements' data to .sqlx/"
    exit 0
fi
if ! diff -r "$seen" .sqlx >"$seen.diff" 2>&1; then
    head -40 "$seen.diff" >&2
    rm -f "$seen.diff"
    die "the query data in .sqlx/ is not what the schema says: run scripts/sqlx-data.sh write, and commit .sqlx/"
fi
rm -f "$seen.diff"
say "the query data of $(ls .sqlx | wc -l) statements is the schema's"
