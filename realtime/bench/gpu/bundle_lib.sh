# shellcheck shell=bash
# Sourced by ray_bundle.sh and vllm_bundle.sh (on the dev machine): what both bundles share.
# `bundle_workdir NAME` makes WORK, a scratch folder under /tmp removed when the script exits;
# `project WHEEL` is a wheel file's normalized project name (PEP 503); `device_download DEST ARGS...`
# downloads CPython 3.12 manylinux x86_64 wheels (the device image's Python) into DEST.

bundle_workdir() {
    WORK="$(mktemp -d "/tmp/$1.XXXXXX")"
    # shellcheck disable=SC2064  # WORK expanded now, on purpose
    trap "rm -rf '$WORK'" EXIT
}

project() {
    basename "$1" | cut -d- -f1 | tr 'A-Z_.' 'a-z--'
}

device_download() {
    local dest="$1"
    shift
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dest" "$@"
}
