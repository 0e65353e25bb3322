"""``robot.device``: config values, resolution, and pi0-tiny served from a CUDA device."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from models.policy.pi0_policy import Pi0Policy
from models.policy.stage import PolicyStage
from models.policy.trivial import ZerosPolicy
from realtime.bench.examples import aloha, libero
from realtime.config import ConfigError, RobotConfig, config_from_mapping
from realtime.kinds.robot import build_policy, resolve_device
from tests.serving import serve_in_process

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


def test_device_field_defaults_to_auto_and_rejects_unknown_values():
    assert RobotConfig().device == "auto"
    assert config_from_mapping({"robot": {"device": "cpu"}}).robot.device == "cpu"
    with pytest.raises(ConfigError, match="robot.device"):
        config_from_mapping({"robot": {"device": "tpu"}})


@no_cuda
def test_auto_resolves_to_the_cpu_and_cuda_fails_clearly_without_a_device():
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(RuntimeError, match="no CUDA device"):
        resolve_device("cuda")
    policy = build_policy(RobotConfig(device="auto"))
    assert policy.device == "cpu" and PolicyStage(policy).device == "cpu"


def test_the_trivial_policy_stays_on_the_cpu():
    policy = build_policy(RobotConfig(policy="zeros", device="cuda"))  # nothing to resolve
    assert isinstance(policy, ZerosPolicy) and PolicyStage(policy).device == "cpu"


@pytest.mark.gpu
def test_pi0_tiny_on_cuda_matches_the_cpu_chunks():
    cpu, gpu = Pi0Policy(), Pi0Policy(device=resolve_device("cuda"))
    assert next(gpu.model.parameters()).is_cuda
    batch = [cpu.prepare(libero(1)), cpu.prepare(aloha(2))]
    for a, b in zip(cpu.infer(batch, [None] * 2), gpu.infer(batch, [None] * 2), strict=True):
        assert isinstance(b, np.ndarray) and b.dtype == np.float32
        np.testing.assert_allclose(a, b, atol=2e-2)  # cuDNN may convolve in TF32


@pytest.mark.gpu
async def test_the_server_runs_pi0_tiny_on_cuda_for_a_real_client():
    config = config_from_mapping({"robot": {"device": "cuda"}, "world": {"enabled": False}})
    async with serve_in_process(config) as (url, server):
        service = server.rt_app.state.rt.kinds[0]
        assert service.policy.device.startswith("cuda") and service.engine.worker.device.startswith("cuda")

        def infer() -> np.ndarray:
            client = WebsocketClientPolicy(url.replace("http://", "ws://"))
            return client.infer(libero(3))["actions"]

        actions = await asyncio.to_thread(infer)
    reference = Pi0Policy()
    expected = reference.infer([reference.prepare(libero(3))], [None])[0]
    np.testing.assert_allclose(actions, expected, atol=2e-2)
