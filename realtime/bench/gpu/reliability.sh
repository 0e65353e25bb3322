#!/usr/bin/env bash
# docs/reliability.md's quiet-machine run: `realtime bench reliability` on two of the device
# machine's cores (taskset: the 2-core machine of issue 26's goals, without the development box's
# other jobs). The voice kind is left out (its weights do not travel); robot, world, echo and both
# duplex routes are in. No GPU is used. About 6 minutes.
# Usage, from the repo root: bash realtime/bench/gpu/reliability.sh [CORES] (default 0,1)
if [ -z "$RELIABILITY_PINNED" ]; then  # the whole script, children included, on CORES
    RELIABILITY_PINNED=1 exec taskset -c "${1:-0,1}" bash "$0" "$@"
fi
source "$(dirname "$0")/env.sh"
python3 -c "import os; print('cores visible:', sorted(os.sched_getaffinity(0)), 'of', os.cpu_count())"
bench reliability --kinds robot,world,echo,duplex --fuzz-seconds 5 --isolation-seconds 20 --churn-cycles 1000 --soak-minutes 2 2>&1 | tee "$OUT/reliability.txt"
