"""Which decoder a world config serves (``WorldModelConfig.vae``), built or loaded from its file.

- ``causal``: the small causal decoder (``vae.py``), weights in our own model file;
- ``wan2.1``: Wan 2.1's VAE decoder (``wan_vae.py``), loaded from ``Wan2.1_VAE.pth``;
- ``taehv``: TAEHV's tiny decoder of the same Wan 2.1 latents (``taehv.py``), from ``taew2_1.pth``.

Each takes normalised latents ``[B, n, C, h, w]`` and a session's ``DecoderState`` and returns
frames in ``[0, 1]`` and the state after them (``models/world/vae.py``'s contract).
"""

from __future__ import annotations

from pathlib import Path

import torch

from models.world.configs import WorldModelConfig
from models.world.taehv import TAEHV, TAEHVDecoder, load_taehv_decoder
from models.world.vae import CausalDecoder
from models.world.wan_vae import WAN_VAE, WanVAEDecoder, load_wan_vae_decoder

Decoder = CausalDecoder | WanVAEDecoder | TAEHVDecoder


def build_decoder(cfg: WorldModelConfig) -> Decoder:
    """``cfg``'s decoder, randomly initialised on the current default device."""
    if cfg.vae == "wan2.1":
        return WanVAEDecoder(WAN_VAE, cfg.latent_height, cfg.latent_width)
    if cfg.vae == "taehv":
        return TAEHVDecoder(TAEHV, cfg.latent_height, cfg.latent_width)
    return CausalDecoder(cfg)


def load_decoder(
    cfg: WorldModelConfig, path: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> Decoder:
    """The decoder of ``world.vae``'s file: ``taew2_1.pth`` for ``taehv``, else ``Wan2.1_VAE.pth``;
    ``CheckpointError`` (one line naming the file) if it is missing or not that decoder's."""
    if cfg.vae == "taehv":
        return load_taehv_decoder(path, cfg.latent_height, cfg.latent_width, device=device, dtype=dtype)
    return load_wan_vae_decoder(path, cfg.latent_height, cfg.latent_width, device=device, dtype=dtype)
