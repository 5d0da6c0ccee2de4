#!/usr/bin/env bash
# sqlx's offline query data, .sqlx/ (checked in): what the query macros read instead of a
# database when the code builds (.cargo/config.toml sets SQLX_OFFLINE).
#
#   scripts/sqlx-data.sh check   the data is what the migrated schema says of every statement,
#                                read by `cargo clippy --workspace --all-targets -D warnings`
#                                (`make test` runs it as its clippy step: one compile serves
#                                both): a stale, missing or extra file fails, as does a lint
#   scripts/sqlx-data.sh write   writes it anew, after a statement or a migration changed
#
# Both describe every statement against the database of `make up` (migrated): the crates with
# query macros are checked again, online, and the macros write what they saw to a scratch
# directory. The check runs in the build's own target directory, so it compiles no dependency
# a second time (`cargo clippy` checks the same ones right after): only those crates are
# checked again. Cargo cannot know the database changed, so their roots are touched first and
# given their times back after, which leaves the build's artifacts of them fresh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

mode=${1:-}
[[ $mode == check || $mode == write ]] || die "usage: scripts/sqlx-data.sh check|write"
[[ -f "$env_file" ]] || die "no ${env_file#"$root/"}: run 'make up' first"
database_url=$(grep '^DATABASE_URL=' "$env_file" | cut -d= -f2-)

# The crates whose code has query macros.
crates=(orderfleet-payments orderfleet-runtime orderfleet outbox-relay notification-worker fleetctl)
packages=()
for crate in "${crates[@]}"; do packages+=(-p "$crate"); done

seen=$(mktemp -d)
roots=()
for crate in "${crates[@]}"; do roots+=("crates/$crate/src/lib.rs"); done
stamps="$seen.stamps"
cd "$root"
# Each root's time, given back on the way out whatever happens.
for file in "${roots[@]}"; do printf '%s %s\n' "$(stat -c %.9Y "$file")" "$file"; done >"$stamps"
restore() {
    while read -r stamp file; do touch -d "@$stamp" "$file"; done <"$stamps"
    rm -rf "$seen" "$stamps"
}
trap restore EXIT
touch "${roots[@]}"
# The check is clippy's own compile, macros online; writing needs only the libraries.
if [[ $mode == check ]]; then
    SQLX_OFFLINE=false SQLX_OFFLINE_DIR="$seen" DATABASE_URL="$database_url" \
        cargo clippy --quiet --workspace --all-targets -- -D warnings
else
    SQLX_OFFLINE=false SQLX_OFFLINE_DIR="$seen" DATABASE_URL="$database_url" \
        cargo check --quiet --lib "${packages[@]}"
fi

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
