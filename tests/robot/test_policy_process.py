"""``robot.process``: the policy built, warmed up and run in a child process, end to end.

Real servers over loopback, real ``openpi-client`` robots, the real pi0-tiny in a real spawned
child. The one layer replaced is the policy's ``infer`` in the child, and only where a fault needs
it (``tests.robot.faulty_policy``: keyed on the prompt). Every server here spawns one child (a
torch import and a warm-up, a few seconds on two cores), so they are few and shared.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import os
import signal
import threading
import time

import httpx
import numpy as np
import pytest

from realtime.bench.examples import droid, libero
from realtime.config import RobotConfig, config_from_mapping
from realtime.kinds import policy_process
from realtime.kinds import robot as robot_kind
from realtime.kinds.policy_process import ProcessPolicy
from sessions.engine.worker import dead_workers
from tests.robot import faulty_policy
from tests.serving import robots_at_once, serve_in_process

pytestmark = pytest.mark.timeout(180)
session_loop = pytest.mark.asyncio(loop_scope="session")  # the module's server lives on that loop

ROBOT = {
    "enabled": True,
    "device": "cpu",
    "process": True,
    "torch_threads": 1,
    "dispatch": "window",  # robots sending at once share a forward
    "coalesce_window_s": 0.1,
}
CONFIG = {"robot": ROBOT, "world": {"enabled": False}, "runtime": {"memory_available_bytes": 1 << 30}}


@pytest.fixture(scope="module")
async def server():
    """One server whose child builds :func:`faulty_policy.build_faulty` (the real pi0-tiny)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(robot_kind, "build_tuned_policy", faulty_policy.build_faulty)
        async with serve_in_process(config_from_mapping(CONFIG)) as (base, srv):
            yield base, _robot(srv)


def _robot(srv):
    return next(kind for kind in srv.rt_app.state.rt.kinds if kind.name == "robot")


def _ws(base: str) -> str:
    return base.replace("http://", "ws://") + "/"


def _errors(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_messages_carry_arrays_out_of_band_and_permuted_views_as_their_memory():
    send, recv = multiprocessing.Pipe()
    chw = np.arange(3 * 224 * 224, dtype=np.uint8).reshape(3, 224, 224)
    message = {"hwc": chw.transpose(1, 2, 0), "big": np.ones((300, 300), np.float32), "small": np.arange(5)}
    sender = threading.Thread(target=policy_process._send, args=(send, message))  # frames outgrow the pipe
    sender.start()
    got = policy_process._recv(recv)
    sender.join(timeout=10)
    for key, value in message.items():
        np.testing.assert_array_equal(got[key], value)
    assert got["hwc"].strides == message["hwc"].strides  # the same view of the same layout
    assert not got["big"].flags.writeable  # a view of the received frame, as wire arrays are
    assert recv.poll() is False  # every frame was read


def test_auto_is_a_process_for_model_policies_on_the_cpu_only():
    assert robot_kind.runs_in_process(RobotConfig(device="cpu"))
    assert robot_kind.runs_in_process(RobotConfig(policy="pi0-shaped", device="cpu"))
    assert not robot_kind.runs_in_process(RobotConfig(policy="zeros", device="cpu"))
    assert robot_kind.runs_in_process(RobotConfig(policy="zeros", process=True))
    assert not robot_kind.runs_in_process(RobotConfig(device="cpu", process=False))
    on_cuda = robot_kind.runs_in_process(RobotConfig(device="auto"))
    assert on_cuda is not __import__("torch").cuda.is_available()
    with pytest.raises(Exception, match="process"):
        config_from_mapping({"robot": {"process": "sometimes"}})


@session_loop
async def test_a_process_serves_the_threads_actions_and_outlives_signals(server):
    base, service = server
    policy = service.policy
    assert isinstance(policy, ProcessPolicy) and policy.served_device == "cpu"
    assert policy.pid != os.getpid() and policy.process.is_alive()
    assert service.engine.worker.device == "cpu"  # the stage's thread only waits on the pipe
    local = robot_kind.build_policy(service.config)  # the thread's policy: same config, same seed
    observations = [libero(3), droid(5)]
    replies = await asyncio.to_thread(robots_at_once, _ws(base), observations)
    for reply, obs in zip(replies, observations, strict=True):
        assert isinstance(reply, dict), reply
        np.testing.assert_allclose(reply["actions"], local.infer([local.prepare(obs)], [None])[0], atol=1e-5)
    for sig in (signal.SIGINT, signal.SIGTERM):  # the server's shutdown owns the child, not signals
        os.kill(policy.pid, sig)
    await asyncio.sleep(0.2)
    (again,) = await asyncio.to_thread(robots_at_once, _ws(base), [libero(3)])
    assert isinstance(again, dict) and policy.process.is_alive()
    np.testing.assert_array_equal(again["actions"], replies[0]["actions"])


@session_loop
async def test_a_bad_observation_gets_its_typed_error_from_the_servers_prepare(server):
    base, _ = server
    bad = {**libero(0), "observation/state": np.zeros(3)}
    (reply,) = await asyncio.to_thread(robots_at_once, _ws(base), [bad])
    assert isinstance(reply, RuntimeError), reply
    text = str(reply)
    assert "invalid_observation: " in text and "'observation/state'" in text and "Traceback" not in text


@session_loop
async def test_a_forward_raising_in_the_child_fails_only_its_item(server, caplog, monkeypatch):
    base, service = server
    forwards, real = [], service.stage.forward

    def forward(items):  # the stage stays in the server: which prompts each forward carried
        forwards.append([item.payload.prepared.observation.prompt for item in items])
        return real(items)

    monkeypatch.setattr(service.stage, "forward", forward)
    for fault in (faulty_policy.POISON, faulty_policy.UNPICKLABLE):
        prompts = [fault, "a", "b", "c"]
        for _ in range(6):  # until the faulty request shared a forward (arrival times vary)
            forwards.clear()
            results = await asyncio.to_thread(
                robots_at_once, _ws(base), [{**libero(0), "prompt": p} for p in prompts]
            )
            failed, others = results[0], results[1:]
            assert isinstance(failed, RuntimeError) and "tick_failed" in str(failed), failed
            assert "Traceback" not in str(failed)
            assert all(isinstance(r, dict) and r["actions"].shape == (50, 7) for r in others), others
            if any(len(f) > 1 and fault in f for f in forwards):
                break
        assert any(len(f) > 1 and fault in f for f in forwards), (fault, forwards)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("ValueError" in m and "exploded" in m for m in warnings), warnings
    assert any("PolicyCallError" in m and "Unpicklable: a forward error" in m for m in warnings), warnings
    assert not _errors(caplog)


@session_loop
async def test_a_killed_child_fails_its_sessions_typed_readyz_503_and_the_server_stops(caplog):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(robot_kind, "build_tuned_policy", faulty_policy.build_faulty)
        async with serve_in_process(config_from_mapping(CONFIG)) as (base, srv):
            policy = _robot(srv).policy
            assert isinstance(policy, ProcessPolicy)
            in_flight = asyncio.create_task(
                asyncio.to_thread(robots_at_once, _ws(base), [{**libero(0), "prompt": faulty_policy.SLOW}])
            )
            await asyncio.sleep(0.5)  # its forward sleeps in the child
            os.kill(policy.pid, signal.SIGKILL)
            (first,) = await asyncio.wait_for(in_flight, 30)
            (later,) = await asyncio.to_thread(robots_at_once, _ws(base), [libero(1)])
            for reply in (first, later):
                assert isinstance(reply, RuntimeError), reply
                text = str(reply)
                assert "StageWorkerDied" in text and "Traceback" not in text
            async with httpx.AsyncClient(base_url=base) as client:
                ready = await client.get("/readyz")
                assert ready.status_code == 503 and "stage worker died: stage-robot-policy" in ready.text
                assert (await client.get("/healthz")).status_code == 200
            started = time.monotonic()
    assert time.monotonic() - started < 10  # the stop did not wait on the dead child
    errors = _errors(caplog)
    # the cause, once, in the log: no ERROR per later forward, release or close
    assert len(errors) == 1 and "robot-policy (pid" in errors[0].getMessage(), [
        r.getMessage() for r in errors
    ]
    assert "died: killed by signal 9" in errors[0].getMessage()
    assert errors[0].exc_info is None  # one line: its cause is in the message
    assert not policy.process.is_alive()
    gc.collect()
    assert dead_workers() == []


@session_loop
async def test_a_child_killed_while_idle_turns_readyz_503_without_a_forward(caplog):
    async with serve_in_process(config_from_mapping(CONFIG)) as (base, srv):
        policy = _robot(srv).policy
        os.kill(policy.pid, signal.SIGKILL)
        async with httpx.AsyncClient(base_url=base) as client:
            deadline = time.monotonic() + 10
            while (ready := await client.get("/readyz")).status_code == 200 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert ready.status_code == 503 and "stage worker died: stage-robot-policy" in ready.text
        (reply,) = await asyncio.to_thread(robots_at_once, _ws(base), [libero(1)])
        assert isinstance(reply, RuntimeError) and "StageWorkerDied" in str(reply), reply
    errors = [r.getMessage() for r in _errors(caplog)]
    assert len(errors) == 1 and "died: killed by signal 9" in errors[0], errors
