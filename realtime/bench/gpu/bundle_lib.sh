# shellcheck shell=bash
# Sourced by ray_bundle.sh and vllm_bundle.sh (on the dev machine): what both bundles share.
# `bundle_workdir NAME` makes WORK, a scratch folder under /tmp removed when the script exits;
# `project WHEEL` is a wheel file's normalized project name (PEP 503).

bundle_workdir() {
    WORK="$(mktemp -d "/tmp/$1.XXXXXX")"
    # shellcheck disable=SC2064  # WORK expanded now, on purpose
    trap "rm -rf '$WORK'" EXIT
}

project() {
    basename "$1" | cut -d- -f1 | tr 'A-Z_.' 'a-z--'
}
