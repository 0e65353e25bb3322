"""Small random world models in float64 for exact comparisons, deterministic actions, and the
config-error check of a world served from files."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import torch
import websockets

from models.world.configs import TEST, WorldModelConfig
from models.world.model import WorldModel, WorldTick


def make_model(
    slots: int = 4, dtype: torch.dtype = torch.float64, cfg: WorldModelConfig = TEST
) -> WorldModel:
    return WorldModel.build(cfg, slots=slots, dtype=dtype, seed=0)


def action(i: int, dim: int = 6) -> torch.Tensor:
    """A deterministic, varied action vector for block ``i``."""
    a = torch.zeros(dim)
    a[i % 4] = 1.0
    a[4] = ((i * 7) % 5 - 2) / 2
    return a


def block_inputs(
    cfg: WorldModelConfig, block: int, sigma: float = 0.5
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random noisy block ``x`` (float64) with its frame positions, timesteps (``1000 sigma``)
    and actions: the arguments of one DiT forward of one session's ``block``."""
    fpb = cfg.frames_per_block
    x = torch.randn(1, fpb, cfg.latent_channels, cfg.latent_height, cfg.latent_width, dtype=torch.float64)
    pos = torch.arange(block * fpb, (block + 1) * fpb)[None]
    timesteps = torch.full((1, fpb), 1000 * sigma, dtype=torch.float64)
    return x, pos, timesteps, action(block).expand(fpb, -1).to(torch.float64)[None]


def model_tensors(model: WorldModel) -> dict[str, torch.Tensor]:
    """A model's tensors in our model-file layout (``dit.*``, ``decoder.*``, ``text.*``)."""
    parts = {"dit": model.dit, "decoder": model.decoder, "text": model.prompts}
    return {f"{name}.{k}": v for name, m in parts.items() for k, v in m.state_dict().items()}


def tick(model: WorldModel, sid: str, i: int, prompt: str | None = "stone maze", act=None) -> WorldTick:
    return WorldTick(sid, model.next_block(sid), prompt, action(i) if act is None else act)


def serve_exits_2_naming(tmp_path: Path, capsys, world: str, missing: Path) -> None:
    """``realtime serve`` with the world section ``world`` (YAML flow map) exits 2 with one line
    that names the ``missing`` file, before any GPU memory is taken."""
    from realtime.cli import main

    config = tmp_path / "world.yaml"
    config.write_text(f"robot: {{enabled: false}}\nworld: {{enabled: true, {world}}}\n")
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(missing) in err and "no such file" in err
    assert not torch.cuda.is_initialized()


@asynccontextmanager
async def world_session(url: str, prompt: str = "a red car in the rain") -> AsyncIterator[tuple[Any, dict]]:
    """A world session (seed 1, fast pacing) on the server at ``url``: its socket and its
    ``session.created`` event."""
    ws_url = url.replace("http://", "ws://") + "/v1/realtime/world?protocol_version=1"
    async with websockets.connect(ws_url, max_size=2**24) as ws:
        await ws.send(json.dumps({"type": "session.start", "prompt": prompt, "seed": 1, "pacing": "fast"}))
        created = json.loads(await ws.recv())
        assert created["type"] == "session.created", created
        yield ws, created
