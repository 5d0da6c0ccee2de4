#!/usr/bin/env bash
# Host-mode LocalStack: for machines without a Docker engine (CI and the development boxes).
#
#   localstack/host.sh venv     create (or reuse) the pinned virtualenv and print its path
#   localstack/host.sh start    start LocalStack on 127.0.0.1:4566 unless ours already runs
#   localstack/host.sh stop     stop the LocalStack this script started (by its recorded pid)
#   localstack/host.sh status   exit 0 when ours is running and healthy
#
# The virtualenv lives outside the checkout, keyed by the hash of requirements-host.txt, so
# every clone on a machine shares one install (~60 s, ~510 MB) and a pin change makes a new one.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
pins="$here/requirements-host.txt"
run_dir="${ORDERFLEET_RUN_DIR:-$root/.run}"
pid_file="$run_dir/localstack.pid"
log_file="$run_dir/localstack.log"
cache_root="${ORDERFLEET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/orderfleet}"
health_url="http://127.0.0.1:4566/_localstack/health"
# Every service the messaging template touches must be listed, or CloudFormation fails the stack.
services="sqs,sns,cloudformation,sts,iam,cloudwatch,kms"

say() { printf 'localstack: %s\n' "$*" >&2; }

venv_dir() {
    local hash
    hash=$(sha256sum "$pins" | cut -c1-16)
    printf '%s/localstack-venv-%s' "$cache_root" "$hash"
}

ensure_venv() {
    local venv python
    venv=$(venv_dir)
    if [[ -x "$venv/bin/python" && -f "$venv/.complete" ]]; then
        printf '%s\n' "$venv"
        return
    fi
    python=${PYTHON:-python3}
    if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
        say "warning: LocalStack 4.13.1 is pinned and tested on Python 3.11; $python is $("$python" --version 2>&1)"
    fi
    mkdir -p "$cache_root"
    # One install at a time per machine: a second clone waits for the first, then reuses it.
    exec 9>"$venv.lock"
    flock 9
    if [[ ! -f "$venv/.complete" ]]; then
        say "creating virtualenv $venv (one time, about a minute)"
        # No .complete marker means an earlier install was interrupted: start over.
        rm -rf "$venv"
        "$python" -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$pins" >&2
        touch "$venv/.complete"
    fi
    exec 9>&-
    printf '%s\n' "$venv"
}

healthy() {
    local body
    body=$(curl -fsS --max-time 2 "$health_url" 2>/dev/null) || return 1
    for service in sqs sns cloudformation; do
        grep -Eq "\"$service\": *\"(available|running)\"" <<<"$body" || return 1
    done
}

our_pid() {
    [[ -f "$pid_file" ]] || return 1
    local pid
    pid=$(cat "$pid_file")
    kill -0 "$pid" 2>/dev/null || return 1
    printf '%s\n' "$pid"
}

start() {
    if our_pid >/dev/null && healthy; then
        say "already running (pid $(cat "$pid_file"))"
        return
    fi
    if healthy; then
        say "something else already serves $health_url; using it as it is"
        return
    fi
    local venv
    venv=$(ensure_venv)
    mkdir -p "$run_dir"
    say "starting on 127.0.0.1:4566 (log: $log_file)"
    # SQS_DISABLE_CLOUDWATCH_METRICS: LocalStack emulates SQS's CloudWatch metrics with two
    # internal PutMetricData calls per message sent and one per receive and delete, about a
    # quarter of its CPU under load (profiled with py-spy; BENCHMARKS.md). AWS does this out
    # of band and free, so it is off by default; SQS_DISABLE_CLOUDWATCH_METRICS=0 make up
    # keeps it, e.g. to watch the DLQ alarms evaluate locally.
    # setsid puts LocalStack in its own process group so `stop` can end it and its children
    # without touching anything else on the machine.
    GATEWAY_LISTEN=127.0.0.1:4566 \
        SERVICES="$services" \
        LOCALSTACK_HOST=localhost:4566 \
        SQS_ENDPOINT_STRATEGY=path \
        PERSISTENCE=0 \
        DISABLE_EVENTS=1 \
        SQS_DISABLE_CLOUDWATCH_METRICS="${SQS_DISABLE_CLOUDWATCH_METRICS:-1}" \
        setsid "$venv/bin/python" -m localstack.runtime.main >"$log_file" 2>&1 </dev/null &
    echo $! >"$pid_file"
    local deadline=$((SECONDS + 120))
    until healthy; do
        if ! our_pid >/dev/null; then
            say "exited during start; last lines of $log_file:"
            tail -n 20 "$log_file" >&2
            exit 1
        fi
        if ((SECONDS > deadline)); then
            say "not healthy after 120 s; see $log_file"
            exit 1
        fi
        sleep 0.5
    done
    say "ready (pid $(cat "$pid_file"))"
}

stop() {
    local pid
    if ! pid=$(our_pid); then
        rm -f "$pid_file"
        say "not running (nothing of ours to stop)"
        return
    fi
    say "stopping pid $pid"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq 1 40); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.25
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pid_file"
}

case "${1:-}" in
venv) ensure_venv ;;
start) start ;;
stop) stop ;;
status) our_pid >/dev/null && healthy ;;
healthy) healthy ;;
*)
    echo "usage: $0 venv|start|stop|status|healthy" >&2
    exit 2
    ;;
esac
