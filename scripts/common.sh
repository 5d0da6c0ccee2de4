# Sourced by the scripts here: where things live, and how they talk.
# shellcheck shell=bash
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
run_dir="${ORDERFLEET_RUN_DIR:-$root/.run}"
env_file="$run_dir/stack.env"
stack_name=orderfleet-messaging
localstack_url="http://127.0.0.1:4566"
mkdir -p "$run_dir"

say() { printf '%s: %s\n' "$(basename "$0" .sh)" "$*" >&2; }
die() { say "$*"; exit 1; }

# Sets KEY=VALUE in the env file the Makefile, the tests and the demo read.
set_env() {
    local key=$1 value=$2 tmp
    tmp=$(mktemp "$run_dir/.stack.env.XXXXXX")
    { [[ -f "$env_file" ]] && grep -v "^$key=" "$env_file" || true; } >"$tmp"
    printf '%s=%s\n' "$key" "$value" >>"$tmp"
    mv "$tmp" "$env_file"
}

# Cargo's build directory (CARGO_TARGET_DIR, or target/ here).
cargo_target_dir() {
    cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}

docker_engine_answers() {
    [[ "${ORDERFLEET_LOCALSTACK_MODE:-}" == host ]] && return 1
    command -v docker >/dev/null 2>&1 && timeout 5 docker info >/dev/null 2>&1
}

# A Python tool from PyPI in a virtualenv of its own in the cache, made once per machine;
# prints the virtualenv's path.   tool_venv NAME VERSION PACKAGE
tool_venv() {
    local name=$1 version=$2 package=$3 venv
    venv="${XDG_CACHE_HOME:-$HOME/.cache}/orderfleet/$name-venv-$version"
    if [[ ! -x "$venv/bin/$name" ]]; then
        say "installing $name $version into $venv (once per machine)"
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet "$package==$version"
    fi
    printf '%s\n' "$venv"
}
