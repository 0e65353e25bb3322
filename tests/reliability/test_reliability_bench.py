"""The reliability suite at CI size: ``realtime bench reliability`` against a real server process.

A few seconds of fuzz on every websocket route of robot, world, echo and duplex (both of its
paths), the isolation run (a connection flood past the limit included), 200 connect / tick /
disconnect cycles, a one-minute soak and SIGTERM under load. Asserted: no crash, no 1011, no
traceback and no ERROR line in the server log, nothing leaked (sessions, websockets, slots,
event-loop tasks, threads, fds), the probes answered 200 throughout, frames over a route's limit
refused (1009), every client closed 1001 at SIGTERM and the process out within the drain bound.
Timing goals (isolation ratio, ``/healthz`` p99, RSS growth) are the bench's to report, on a
quiet machine, not this test's. The voice kind (a 40-70 s model load) runs in the full bench.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from realtime.bench import reliability

pytestmark = pytest.mark.timeout(600)

BOUND_S = 5.0
CI_ARGS = [
    "--small",
    "--kinds", "robot,world,echo,duplex",
    "--fuzz-seconds", "3",
    "--isolation-seconds", "5",
    "--churn-cycles", "200",
    "--soak-minutes", "1",
    "--shutdown-timeout", str(BOUND_S),
]  # fmt: skip


def test_ci_sized_reliability_run(tmp_path, capsys):
    status = reliability.main([*CI_ARGS, "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    figures = json.loads(out.strip().splitlines()[-1])
    context = out[-6000:]
    assert figures["crashes"] == 0 and figures["closes_1011"] == 0, context
    assert figures["tracebacks"] == 0 and figures["error_lines"] == 0, context
    assert figures["leaked_sessions"] == 0 and figures["leaks"] == {}, context
    assert figures["probe_failures"] == 0, context
    assert figures["fuzz_frames"] > 500 and figures["closes_1009"] > 0, context
    assert figures["churn_cycles"] == 200, context
    assert figures["sigterm_exit_code"] == 0, context
    assert set(figures["sigterm_closes"].values()) == {1001}, context
    assert figures["sigterm_exit_s"] <= BOUND_S + reliability.EXIT_SLACK_S, context
    assert status == 0, context


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pinning needs Linux")
def test_server_cores_pins_the_server_and_every_thread_it_starts(tmp_path):
    """``--server-cores``: the server process, and each thread it starts, on those cores only."""
    core = max(os.sched_getaffinity(0))
    server = reliability.ServerProcess(reliability.deploy_config(("echo",), BOUND_S, True), tmp_path, (core,))
    try:
        server.start()
        tasks = Path(f"/proc/{server.proc.pid}/task")
        assert {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(tasks)} == {frozenset({core})}
    finally:
        server.stop()


@pytest.mark.parametrize("cores", ["100000", "all"], ids=["a core it may not use", "all of its cores"])
def test_server_cores_that_leave_the_bench_nothing_are_refused(cores, capsys):
    own = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    with pytest.raises(SystemExit) as exit_:
        reliability.main(["--parts", "isolation", "--server-cores", own if cores == "all" else cores])
    assert exit_.value.code == 2 and "--server-cores" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, says",
    [
        (["--parts", "soak", "--soak-minutes", "0"], "--soak-minutes must be > 0"),
        (["--parts", "churn", "--churn-cycles", "-1"], "--churn-cycles must be > 0"),
        (["--parts", "fuzz,soakk"], "--parts: soakk"),
        (["--parts", "churn", "--kinds", "robot,vid"], "--kinds: vid"),
    ],
    ids=["no soak time", "negative churn", "unknown part", "unknown kind"],
)
def test_run_arguments_that_cannot_run_are_refused_before_the_server_starts(args, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        reliability.main(args)
    assert exit_.value.code == 2 and says in capsys.readouterr().err
