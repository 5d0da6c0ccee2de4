#!/usr/bin/env bash
# PostgreSQL for orderfleet.
#
#   scripts/postgres.sh up     make a database reachable and write DATABASE_URL to .run/stack.env
#   scripts/postgres.sh down   stop the local cluster, only if `up` started it
#
# With DATABASE_URL set, that database is used as it is. Otherwise the machine's local cluster
# is started (Debian's pg_ctlcluster; the postgresql package is installed with apt-get when
# missing and we are root), and a role and database `orderfleet` are created.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

started_marker="$run_dir/postgres.started"
# A local, throwaway credential for the loopback-only development cluster.
local_user=orderfleet
local_password=orderfleet
local_db=orderfleet

as_postgres() {
    # From /, which postgres may enter (it may not enter root's working directory).
    if [[ $(id -un) == postgres ]]; then "$@"; else (cd / && runuser -u postgres -- "$@"); fi
}

first_cluster() {
    # "VERSION NAME PORT STATUS ..." of the first cluster, if any.
    pg_lsclusters --no-header 2>/dev/null | awk 'NF { print $1, $2, $3, $4; exit }'
}

up() {
    if [[ -n "${DATABASE_URL:-}" ]]; then
        command -v pg_isready >/dev/null && ! pg_isready -q -d "$DATABASE_URL" -t 10 &&
            die "DATABASE_URL is set but that server does not answer; start it or unset DATABASE_URL"
        service_roles "$DATABASE_URL"
        set_env DATABASE_URL "$DATABASE_URL"
        say "using DATABASE_URL from the environment"
        return
    fi
    if ! command -v pg_ctlcluster >/dev/null; then
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
            say "installing PostgreSQL with apt-get"
            apt_install postgresql
        else
            die "no PostgreSQL here: install it (Debian: sudo apt-get install postgresql) or set DATABASE_URL"
        fi
    fi
    local cluster version name port status
    cluster=$(first_cluster)
    if [[ -z "$cluster" ]]; then
        [[ $(id -u) == 0 ]] || die "no PostgreSQL cluster: create one (sudo pg_createcluster --start 15 main) or set DATABASE_URL"
        version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
        say "creating cluster $version/main"
        pg_createcluster "$version" main >/dev/null
        cluster=$(first_cluster)
    fi
    read -r version name port status <<<"$cluster"
    if [[ "$status" != online* ]]; then
        [[ $(id -u) == 0 || $(id -un) == postgres ]] ||
            die "PostgreSQL $version/$name is down: start it (sudo pg_ctlcluster $version $name start) or set DATABASE_URL"
        enough_connections "$version" "$name"
        say "starting PostgreSQL $version/$name on port $port"
        pg_ctlcluster "$version" "$name" start
        echo "$version $name" >"$started_marker"
    elif [[ -f "$started_marker" ]] && (($(as_postgres psql -p "$port" -At -c 'SHOW max_connections') < max_connections)); then
        enough_connections "$version" "$name"
        say "restarting PostgreSQL $version/$name (started by make up) for max_connections = $max_connections"
        pg_ctlcluster "$version" "$name" restart
    else
        say "PostgreSQL $version/$name is running on port $port"
        local current
        current=$(configured_connections "$version" "$name")
        ((current >= max_connections)) ||
            say "its max_connections is $current, so make test runs fewer end-to-end tests at once; for eight: sudo pg_conftool $version $name set max_connections $max_connections, then restart it"
    fi
    if [[ $(id -u) == 0 || $(id -un) == postgres ]]; then
        # CREATEDB: every test makes a database of its own, so tests run in parallel.
        as_postgres psql -q -p "$port" -v ON_ERROR_STOP=1 <<SQL
SELECT 'CREATE ROLE $local_user LOGIN CREATEDB PASSWORD ''$local_password'''
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$local_user') \gexec
SELECT 'CREATE DATABASE $local_db OWNER $local_user'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$local_db') \gexec
-- So the tests' DROP DATABASE … WITH (FORCE) ends the sessions the service roles left open.
SELECT 'GRANT pg_signal_backend TO $local_user'
WHERE NOT pg_has_role('$local_user', 'pg_signal_backend', 'MEMBER') \gexec
SQL
    fi
    local url="postgres://$local_user:$local_password@127.0.0.1:$port/$local_db"
    pg_isready -q -d "$url" -t 30 || die "PostgreSQL does not answer at 127.0.0.1:$port"
    if [[ $(id -u) == 0 || $(id -un) == postgres ]]; then
        roles_log_in "$url" || as_postgres psql -q -p "$port" -v ON_ERROR_STOP=1 -f - <"$root/scripts/dev-roles.sql"
    else
        service_roles "$url"
    fi
    set_env DATABASE_URL "$url"
}

# The suite runs several end-to-end tests at once, each with a fleet of its own (about 70
# connections at most: five processes' pools and the test's own); Debian's default of 100 would
# let one at a time run. On the local cluster `make up` starts, it is raised before the start;
# elsewhere scripts/test.sh runs as many tests at once as the server's limit allows.
max_connections=1000
enough_connections() {
    local version=$1 name=$2
    (($(configured_connections "$version" "$name") >= max_connections)) ||
        pg_conftool "$version" "$name" set max_connections "$max_connections"
}
# The cluster's configured max_connections (PostgreSQL's default, 100, when unset).
configured_connections() {
    pg_conftool -s "$1" "$2" show max_connections 2>/dev/null || echo 100
}

# The roles each binary connects as (migration 0010 grants their table rights), able to log
# in with development passwords: the tests and the demo run every binary as its own role.
# Nothing to do when they already can; on another machine's server, never done unasked
# (it sets each role's password to its name).
service_roles() {
    local url=$1 host
    roles_log_in "$url" && return
    command -v psql >/dev/null || die "psql is needed to set up the service roles (scripts/dev-roles.sql)"
    host=$(sed -E 's#^[a-z]+://([^@/]*@)?(\[[^]]*\]|[^:/?]*).*#\2#' <<<"$url")
    case "$host" in
        127.0.0.1 | localhost | "[::1]" | "") ;;
        *) die "the service roles cannot log in to $host: set them up there (docs/security.md), or on a throwaway server run scripts/dev-roles.sql as a superuser" ;;
    esac
    psql -q -v ON_ERROR_STOP=1 -d "$url" -f "$root/scripts/dev-roles.sql" ||
        die "could not set up the service roles: DATABASE_URL's role needs CREATEROLE (and, from PostgreSQL 16, ADMIN OPTION on roles it did not create), or run scripts/dev-roles.sql as a superuser"
}

# Whether every service role logs in with its development password.
roles_log_in() {
    local url=$1 role
    command -v psql >/dev/null || return 1
    for role in $(grep -o "'orderfleet_[a-z_]*'" "$root/scripts/dev-roles.sql" | tr -d "'"); do
        PGCONNECT_TIMEOUT=5 psql -q -At -d "$(sed -E "s#^([a-z]+://)([^@/]*@)?#\1$role:$role@#" <<<"$url")" \
            -c 'SELECT 1' >/dev/null 2>&1 || return 1
    done
}

down() {
    if [[ -f "$started_marker" ]]; then
        local version name
        read -r version name <"$started_marker"
        say "stopping PostgreSQL $version/$name (started by make up)"
        pg_ctlcluster "$version" "$name" stop || true
        rm -f "$started_marker"
    else
        say "PostgreSQL was not started by make up; leaving it as it is"
    fi
}

case "${1:-}" in
up) up ;;
down) down ;;
*) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
