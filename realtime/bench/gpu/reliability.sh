#!/usr/bin/env bash
# docs/reliability.md's quiet-machine run: `realtime bench reliability` on two of the device
# machine's cores (taskset: the 2-core machine of issue 26's goals, without the development box's
# other jobs). The voice kind is left out (its weights do not travel); robot, world, echo and both
# duplex routes are in. No GPU is used. About 6 minutes.
# Usage, from the repo root: bash realtime/bench/gpu/reliability.sh [CORES] (default 0,1)
source "$(dirname "$0")/env.sh"
CORES="${1:-0,1}"
taskset -c "$CORES" python3 -c "import os; print('cores visible:', sorted(os.sched_getaffinity(0)), 'of', os.cpu_count())"
taskset -c "$CORES" python3 -m realtime.cli bench reliability --kinds robot,world,echo,duplex \
    --fuzz-seconds 5 --isolation-seconds 20 --churn-cycles 1000 --soak-minutes 2 2>&1 | tee "$OUT/reliability.txt"
