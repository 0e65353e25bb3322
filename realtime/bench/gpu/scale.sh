#!/usr/bin/env bash
# Issue 28's throughput_ratio_2_vs_1 where each replica has cores of its own (no GPU needed):
# `realtime bench scale --cores` pins replica r to the r-th block of PER_REPLICA cores of CORES
# (one torch thread per core), runs the single server on the first block, and itself, its robot
# clients, the ingress, Serve's proxy and Ray's other processes on the cores after the two blocks. The whole
# script stays on CORES, so a GPU job may use the others. About 2 minutes.
# CORES: default 12-15 (replicas on 12 and 13, the rest on 14-15); PER_REPLICA: default 1;
# THREADS: torch threads per server and replica, default PER_REPLICA (with voice sessions beside
# the robots, 1: the policy's process and the voice stages each on a core, no OpenMP threads
# spinning against each other); CLIENTS: the robots of (b) and (c), default 16 (two full batches: bench scale's docstring says why).
# Needs Ray Serve (ray[serve]==2.60.0), which the device machine lacks and whose wheel (79 MB) is
# over what one call carries: ray_bundle.sh (its header gives the two calls) builds a bundle of it
# whose part 1 a first call copies to /tmp/raypart/; here the parts (the rest in .rayb/, if any)
# are joined, checked, extracted once into /tmp/site-ray and put on PYTHONPATH.
# Voice sessions in (c) need the voice kind's stack: voice_bundle.sh (its header gives the calls).
# Without Ray Serve the script says so and ends with status 0.
# Usage, from the repo root: CORES=12-15 bash realtime/bench/gpu/scale.sh
source "$(dirname "$0")/env.sh"
ray_parts() {
    cat /tmp/raypart/ray.tar.xz.a? $(compgen -G ".rayb/ray.tar.xz.a?")
}
if [ ! -e /tmp/site-ray/.extracted ] && [ -e /tmp/raypart/ray.tar.xz.sha256 ]; then
    if [ "$(ray_parts | sha256sum | cut -d' ' -f1)" != "$(cut -d' ' -f1 /tmp/raypart/ray.tar.xz.sha256)" ]; then
        echo "scale.sh: the Ray bundle's parts do not match its sum (was .rayb carried?)"
        exit 1
    fi
    rm -rf /tmp/site-ray.part && mkdir -p /tmp/site-ray.part
    ray_parts | xz -d | tar xf - -C /tmp/site-ray.part || exit 1
    touch /tmp/site-ray.part/.extracted && mv /tmp/site-ray.part /tmp/site-ray
fi
[ -e /tmp/site-ray/.extracted ] && export PYTHONPATH="$PYTHONPATH:/tmp/site-ray"
# the voice kind's default stack (voice_bundle.sh's parts, copied to /tmp/vcpart/ call by call):
# joined, checked and installed once into /tmp/site-voice; without it (c) measures robots only
if [ ! -e /tmp/site-voice/.installed ] && [ -e /tmp/vcpart/voice.tar.sha256 ]; then
    if [ "$(cat /tmp/vcpart/voice.tar.? | sha256sum | cut -d' ' -f1)" != "$(cut -d' ' -f1 /tmp/vcpart/voice.tar.sha256)" ]; then
        echo "scale.sh: the voice bundle's parts do not match its sum (all $(cat /tmp/vcpart/parts) copied?)"
        exit 1
    fi
    rm -rf /tmp/vcwheels /tmp/site-voice && mkdir -p /tmp/vcwheels
    cat /tmp/vcpart/voice.tar.? | tar xf - -C /tmp/vcwheels || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-voice \
        /tmp/vcwheels/*.whl || exit 1
    touch /tmp/site-voice/.installed
fi
if [ -e /tmp/site-voice/.installed ]; then
    export PYTHONPATH="/tmp/site-voice:$PYTHONPATH"  # first: .whlb holds a tokenizer-only Whisper wheel
    # the caches the replicas would build at their first load (Whisper joined, SmolLM2 converted)
    python3 -c "from models.voice import asr, llm; asr.whisper_base_dir(); llm.smollm2_dir()" || exit 1
fi
CORES="${CORES:-12-15}"
PER_REPLICA="${PER_REPLICA:-1}"
THREADS="${THREADS:-$PER_REPLICA}"
CLIENTS="${CLIENTS:-16}"
if ! err="$(python3 -c "import ray.serve" 2>&1)"; then
    echo "scale.sh: Ray Serve is not installed (pip install -e '.[ray]'; on the device: ray_bundle.sh): ${err##*$'\n'}; nothing to run"
    exit 0
fi
taskset -cp "$CORES" $$ >/dev/null || exit 1
bench scale --seconds 10 --cores "$CORES" --cpus-per-replica "$PER_REPLICA" --threads "$THREADS" \
    --clients "$CLIENTS" 2>&1 | tee "$OUT/scale.txt"
