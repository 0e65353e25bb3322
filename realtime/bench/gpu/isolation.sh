#!/usr/bin/env bash
# docs/reliability.md's isolation figure on two quiet cores of the device machine, several times
# (the figure is a ratio of two p99s and noisy): `realtime bench reliability --parts isolation`
# RUNS times (default 3), each with a fresh server, robot, world, echo and both duplex routes
# attacked, as reliability.sh runs it. No GPU is used. About 1.5 minutes a run.
# With CLIENT_CORES the server alone gets CORES (`--server-cores`) and the bench, its robot, its
# probe and every attacker run on CLIENT_CORES, as clients on other machines would: the server's
# isolation without the attackers' own CPU on its cores. Without it everything shares CORES.
# ROBOT_PROCESS (a space-separated list of auto, true, false; default auto, which is true for the
# bench's pi0-tiny on the CPU) is `--robot-process`: each run measures every value in turn, so
# ROBOT_PROCESS="false true" compares the robot's policy on a thread and in its own process in one
# time window; the summary prints each value's ratios and median.
# Usage, from the repo root: bash realtime/bench/gpu/isolation.sh [CORES] [RUNS] [CLIENT_CORES]
# (default 0,1, 3 and none)
if [ -z "$RELIABILITY_PINNED" ]; then  # the whole script, children included, on CORES (and CLIENT_CORES)
    RELIABILITY_PINNED=1 exec taskset -c "${1:-0,1}${3:+,$3}" bash "$0" "$@"
fi
source "$(dirname "$0")/env.sh"
python3 -c "import os; print('cores visible:', sorted(os.sched_getaffinity(0)), 'of', os.cpu_count())"
for run in $(seq "${2:-3}"); do
    for mode in ${ROBOT_PROCESS:-auto}; do
        echo "== isolation run $run, robot.process $mode, $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
        bench reliability --kinds robot,world,echo,duplex --parts isolation --isolation-seconds 20 \
            --robot-process "$mode" ${3:+--server-cores "${1:-0,1}"} 2>&1 | tee -a "$OUT/isolation.txt" \
            | grep -E "isolation:|isolation_p99_ratio|healthz_p99_ms"
    done
done
grep '^{' "$OUT/isolation.txt" | python3 -c "
import json, statistics, sys
rows = [json.loads(line) for line in sys.stdin]
for mode in sorted({r.get('robot_process', 'auto') for r in rows}):
    mine = [r for r in rows if r.get('robot_process', 'auto') == mode]
    ratios = [r['isolation_p99_ratio'] for r in mine]
    read = [x for x in ratios if x is not None]
    print('robot.process', mode, 'isolation_p99_ratio', ratios, 'median', statistics.median(read) if read else None,
          'healthz_p99_ms', [r['healthz_p99_ms'] for r in mine])
"
