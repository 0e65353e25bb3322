# shellcheck shell=bash source-path=SCRIPTDIR
# Sourced after env.sh by the GPU run scripts that need vLLM or the voice kind's libraries
# (hibari-tts, silero-vad), from the repo root on the device machine. `bash
# realtime/bench/gpu/vllm_env.sh` runs it alone: it sources env.sh first, then says where the
# bundle stands and, once it is extracted, imports vllm, flashinfer, hibari and the rest.
#
# vllm_bundle.sh (run on the dev machine) packs them into parts: .vlla/ (part 1, the sum of the
# whole and the list of parts), .vllb/, .vllc/ ..., one carried per call, back to back on a warm
# machine (its header gives the calls). Each call's carried part is copied to /tmp/vllpart/; once
# every listed part is there the sum is checked, the parts are extracted once into
# /tmp/site-vllm (marker .extracted) and removed. /tmp/site-vllm goes on PYTHONPATH after
# /tmp/site (the .whl/ wheels keep precedence) and before everything else; later calls on the same
# machine reuse it and carry nothing. A missing part or a bundle not begun is reported, not fatal:
# the caller's own check (import vllm) decides.
# Returns 1 (the caller's `|| exit 1`) when a copy fails, the sum does not match or the
# extraction fails.

vllm_parts() {
    # shellcheck disable=SC2046  # the part names, one word each
    (cd /tmp/vllpart && cat $(tail -n +2 vll.tar.xz.sha256))
}

vllm_bundle() {
    local part name want got
    local -a listed=() missing=()
    if [ ! -e /tmp/site-vllm/.extracted ]; then
        mkdir -p /tmp/vllpart || return 1
        for part in .vll[a-z]/vll.tar.xz.*; do
            if [ -e "$part" ]; then
                cp "$part" /tmp/vllpart/ || return 1
            fi
        done
        if [ ! -e /tmp/vllpart/vll.tar.xz.sha256 ]; then
            echo "vllm_env.sh: no vLLM bundle on this machine (carry .vlla first; vllm_bundle.sh's header gives the calls)"
            return 0
        fi
        mapfile -t listed < <(tail -n +2 /tmp/vllpart/vll.tar.xz.sha256)
        for name in "${listed[@]}"; do
            [ -e "/tmp/vllpart/$name" ] || missing+=("$name")
        done
        if [ "${#missing[@]}" -gt 0 ]; then
            echo "vllm_env.sh: vLLM bundle: $((${#listed[@]} - ${#missing[@]})) of ${#listed[@]} parts here, still to carry: ${missing[*]} (.vlla holds .aa, .vllb .ab, ...)"
            return 0
        fi
        want="$(head -1 /tmp/vllpart/vll.tar.xz.sha256 | cut -d' ' -f1)"
        got="$(vllm_parts | sha256sum | cut -d' ' -f1)"
        if [ "$got" != "$want" ]; then
            echo "vllm_env.sh: the vLLM bundle's parts do not match its sum (from another build?); rm -rf /tmp/vllpart and carry them again"
            return 1
        fi
        rm -rf /tmp/site-vllm.part && mkdir -p /tmp/site-vllm.part || return 1
        vllm_parts | xz -d -T0 | tar xf - -C /tmp/site-vllm.part || return 1
        touch /tmp/site-vllm.part/.extracted && mv /tmp/site-vllm.part /tmp/site-vllm || return 1
        rm -rf /tmp/vllpart
        echo "vllm_env.sh: vLLM bundle extracted into /tmp/site-vllm ($(du -sm /tmp/site-vllm | cut -f1) MB)"
    fi
    case ":$PYTHONPATH:" in
    *:/tmp/site-vllm:*) ;;
    :/tmp/site:*) PYTHONPATH="/tmp/site:/tmp/site-vllm${PYTHONPATH#/tmp/site}" ;;
    *) PYTHONPATH="/tmp/site-vllm${PYTHONPATH:+:$PYTHONPATH}" ;;
    esac
    export PYTHONPATH
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    # run on its own: env.sh's /tmp/site (from a carried .whl), this bundle, then a check
    source "$(dirname "$0")/env.sh"
    vllm_bundle || exit 1
    if [ -e /tmp/site-vllm/.extracted ]; then
        python3 -c "
import importlib.metadata as md, vllm, flashinfer, xgrammar, hibari, onnxruntime
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM
print('vllm', vllm.__version__, 'from', vllm.__file__)
print('flashinfer', flashinfer.__version__, '| silero-vad', md.version('silero-vad'), '| hibari-tts', md.version('hibari-tts'))
" || exit 1
    fi
else
    vllm_bundle || return 1
fi
