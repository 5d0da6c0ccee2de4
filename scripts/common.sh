# Sourced by the scripts here: where things live, and how they talk.
# shellcheck shell=bash
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
run_dir="${ORDERFLEET_RUN_DIR:-$root/.run}"
env_file="$run_dir/stack.env"
stack_name=orderfleet-messaging
localstack_url="http://127.0.0.1:4566"
mkdir -p "$run_dir"
# Cargo tools the scripts install once per machine (cargo-deny, cargo-machete; cargo-nextest
# where the machine has none), after whatever the machine already has.
tools_dir="${XDG_CACHE_HOME:-$HOME/.cache}/orderfleet/tools"
export PATH="$PATH:$tools_dir/bin"

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

# Step timings. `step NAME` ends the step before it (printing "NAME: N s") and starts NAME; the
# outermost script of a make target (`timed TARGET`) prints every step's seconds when it ends,
# however it ends, and keeps them in .run/timings-TARGET.tsv. Scripts it runs (up.sh inside
# test.sh) add their steps to the same list through ORDERFLEET_TIMINGS.
step_name=""
step() {
    step_end
    step_name="$*"
    step_started=$EPOCHREALTIME
    say "$step_name"
}
step_end() {
    [[ -n "$step_name" ]] || return 0
    timing "$(since "$step_started")" "$step_name"
    step_name=""
}
# Records SECONDS for NAME: a step, or work that ran in the background beside the steps.
timing() {
    say "$2: $1 s"
    [[ -z "${ORDERFLEET_TIMINGS:-}" ]] || printf '%s\t%s\n' "$1" "$2" >>"$ORDERFLEET_TIMINGS"
}
# The seconds since EPOCHREALTIME was START.
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
timed() {
    local target=$1
    [[ -z "${ORDERFLEET_TIMINGS:-}" ]] || return 0
    export ORDERFLEET_TIMINGS="$run_dir/timings-$target.tsv"
    : >"$ORDERFLEET_TIMINGS"
    timed_target=$target
    timed_started=$EPOCHREALTIME
    on_exit 'timed_summary "$status"'
}
timed_summary() {
    local status=$1
    step_end
    {
        printf '\nmake %s: %s after %s s; the steps (seconds):\n' "$timed_target" \
            "$([[ $status == 0 ]] && echo passed || echo "FAILED (exit $status)")" \
            "$(since "$timed_started")"
        awk -F'\t' '{ printf "  %7.1f  %s\n", $1, $2 }' "$ORDERFLEET_TIMINGS"
        printf '  (work marked "in the background" overlapped the steps around it)\n'
    } >&2
}

# Work in the background beside the steps (the build beside the services' start, the tools'
# install beside the build): `in_background KEY LABEL LOG COMMAND...` starts COMMAND in a process
# group of its own, its output to LOG, stopped with everything under it if the script exits
# before `await_background KEY`, which waits for it as a step, records its own seconds, shows
# its output and stops the script if it failed.
declare -A background_pid background_label background_log background_started
in_background() {
    local key=$1
    background_label[$key]=$2
    background_log[$key]=$3
    background_started[$key]=$EPOCHREALTIME
    shift 3
    setsid -w "$@" >"${background_log[$key]}" 2>&1 &
    background_pid[$key]=$!
    on_exit "[[ -z \"\${background_pid[$key]}\" ]] || kill -- \"-\${background_pid[$key]}\" 2>/dev/null"
}
await_background() {
    local key=$1 status=0 label=${background_label[$1]} log=${background_log[$1]}
    step "waiting for $label"
    wait "${background_pid[$key]}" || status=$?
    background_pid[$key]=""
    step_end
    timing "$(since "${background_started[$key]}")" "$label (in the background, from its start)"
    cat "$log" >&2
    ((status == 0)) || die "$label failed (its output is above and in ${log#"$root/"})"
}

# Cargo's output directory for a profile's build: target/debug for dev, target/<name> otherwise.
profile_dir() {
    printf '%s/%s\n' "$(cargo_target_dir)" "$([[ "$1" == dev ]] && echo debug || echo "$1")"
}

# Commands run when the script exits, however it exits, in the order given; each sees the
# exit status as $status.
exit_hooks=()
on_exit() {
    exit_hooks+=("$1")
    trap 'run_exit_hooks $?' EXIT
}
run_exit_hooks() {
    local status=$1 hook
    for hook in "${exit_hooks[@]}"; do eval "$hook" || true; done
    exit "$status"
}

# Debian packages, installed with apt-get as root. One apt-get at a time: `make test` installs
# buildah (scripts/tools.sh) while `make up` may be installing PostgreSQL, and dpkg takes one.
#   apt_install PACKAGE...
apt_install() {
    local lock=(-o DPkg::Lock::Timeout=600)
    (
        flock 8
        DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" install -y -q "$@" >/dev/null ||
            { apt-get "${lock[@]}" update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" install -y -q "$@" >/dev/null; }
    ) 8>"$run_dir/apt.lock"
}

# A cargo tool at VERSION in the tools directory, built there once (cargo_tool) unless the
# one there already says that version; its path is printed.
#   tool=$(ensure_cargo_tool CRATE VERSION)
ensure_cargo_tool() {
    local crate=$1 version=$2 bin="$tools_dir/bin/$1"
    if [[ ! -x "$bin" ]] || ! "$bin" --version | grep -q "$version"; then
        say "installing $crate $version (once per machine, about two minutes)" >&2
        cargo_tool "$crate" "$version" >&2
    fi
    printf '%s\n' "$bin"
}

# cargo-nextest, the suite's runner (0.9.91 or later: .config/nextest.toml sets priorities).
# These machines come with it; where it is missing or older, it is built once into the tools.
need_nextest() {
    local have
    have=$(cargo nextest --version 2>/dev/null | awk 'NR == 1 { print $2 }')
    if [[ -z "$have" ]] || [[ "$(printf '%s\n' 0.9.91 "$have" | sort -V | head -n 1)" != 0.9.91 ]]; then
        say "installing cargo-nextest 0.9.143 (once per machine; found: ${have:-none})"
        cargo_tool cargo-nextest 0.9.143
    fi
}

# A cargo tool from crates.io into the tools directory, built in a directory of its own (so it
# never waits on the workspace's build lock) that is removed after. Tools' own release profiles
# often link with fat LTO in one unit (cargo-deny's: 222 s of a first `make test`); a tool run
# on one workspace has no use for it, so this links without LTO, in 16 units.
#   cargo_tool CRATE VERSION
cargo_tool() {
    local crate=$1 version=$2 build
    local status=0
    build=$(mktemp -d)
    CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
        cargo install --quiet --locked "$crate@$version" --root "$tools_dir" --target-dir "$build" || status=$?
    rm -rf "$build"
    return "$status"
}
