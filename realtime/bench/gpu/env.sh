# Sourced by the GPU run scripts of this folder, from the repo root on the device machine.
#
# The bare device machine lacks some packages: carry their wheels in .whl/ (listed in
# docs/benchmarks.md, "GPU runs"); they are installed into /tmp/site. Output goes to $OUT (the
# device tool's folder), else ./out. FA4_PATH (optional): folders to add to PYTHONPATH for
# FlashAttention-4, colon-separated (docs/benchmarks-log.md, "world: FlashAttention-4", says which).
# `bench ARGS` is `realtime bench ARGS` from this checkout.
# `require_cuda` ends the calling script with status 0 and one line when torch finds no CUDA device.

# FlashAttention-4 in two carries (docs/benchmarks-log.md, "world: FlashAttention-4"): a first call
# copies .fa4a/part_aa to /tmp/fa4p/, the next carries .fa4b/part_ab; joined and unpacked once,
# and used by every later call on the same machine.
if [ ! -e /tmp/fa4site/.unpacked ] && [ -e /tmp/fa4p/part_aa ] && compgen -G ".fa4b/part_a*" >/dev/null; then
    mkdir -p /tmp/fa4site && cat /tmp/fa4p/part_aa .fa4b/part_a* | xz -d | tar xf - -C /tmp/fa4site || exit 1
    touch /tmp/fa4site/.unpacked
fi
if [ -z "$FA4_PATH" ] && [ -e /tmp/fa4site/.unpacked ]; then
    FA4_PATH="/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages"
fi
# once per machine: a second script sourcing this must not rewrite modules a running one imports;
# a later call that cannot carry .whl beside something larger (FA4's second part) reuses it.
# Every wheel carried in .whl/ and .whlb/ is installed, each name once (.whlb is .whl less PyAV,
# 16 MB, to fit beside a larger carry; .whlb with PyAV's wheel alone, .whl/av-*.whl, is the whole
# set in 52 MB)
WHEELS=$(ls .whl/*.whl .whlb/*.whl 2>/dev/null | awk -F/ '!seen[$NF]++')
if [ -n "$WHEELS" ] && [ ! -e /tmp/site/.installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site $WHEELS || exit 1
    touch /tmp/site/.installed
fi
# FlashAttention-3's forward (the fa3-fwd wheel, 27 MB: device_wheels.sh FA3=1) where .fa3 is carried
if compgen -G ".fa3/*.whl" >/dev/null && [ ! -e /tmp/site/.fa3 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .fa3/*.whl || exit 1
    touch /tmp/site/.fa3
fi
if [ -e /tmp/site/.installed ] || [ -e /tmp/site/.fa3 ]; then
    export PYTHONPATH="/tmp/site:$PWD${FA4_PATH:+:$FA4_PATH}"
else
    export PYTHONPATH="$PWD${FA4_PATH:+:$FA4_PATH}"
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
OUT="${OUT:-out}"
mkdir -p "$OUT"
set -o pipefail

bench() {
    python3 -m realtime.cli bench "$@"
}

require_cuda() {
    if ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "$(basename "$0"): torch finds no CUDA device; nothing to run"
        exit 0
    fi
}
