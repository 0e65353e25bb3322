"""Random weights at the real size in the real layouts, for ``realtime bench world --model
self-forcing`` on a machine without the released files (speed does not depend on the weights).

``realtime bench world --write-random-checkpoint DIR [--model causvid]`` writes into ``DIR``:

- ``self_forcing_dmd.pt`` (or CausVid's ``model.pt``): the Wan-2.1-T2V-1.3B causal DiT in the peer's
  own layout (``{"generator": {"model." + key: ...}, "generator_ema": ...}``; bf16, 2.8 GB), read
  back through ``models.world.checkpoints`` like a downloaded one;
- ``Wan2.1_VAE.pth``: the Wan 2.1 VAE decoder under the official key names (``wan_vae.wan_name``);
- ``taew2_1.pth``: TAEHV's decoder of the same latents (``world.decoder: taehv``), its official keys;
- ``prompts.safetensors``: umT5-shaped embeddings (``[L, 4096]``) of the bench's prompts and of the
  empty prompt, a ``world.prompt_embeddings`` file (``models.world.text_encoder``).

Then: ``realtime bench world --e2e --model self-forcing --checkpoint DIR/self_forcing_dmd.pt --vae
DIR/Wan2.1_VAE.pth --prompt-embeddings DIR/prompts.safetensors ...`` (``--decoder taehv --vae
DIR/taew2_1.pth`` for TAEHV's decoder).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from models.world.checkpoints import peer_layout
from models.world.configs import CHECKPOINT_MODELS
from models.world.dit import CausalDiT
from models.world.taehv import TAEHV, TAEHVDecoder
from models.world.wan_vae import WAN_VAE, WanVAEDecoder, wan_name

BENCH_PROMPTS = ("", "stone")  # the e2e and key-to-frame clients' prompt, and a session without one
FILES = {"self-forcing": "self_forcing_dmd.pt", "causvid": "model.pt"}


@torch.no_grad()
def write_random_checkpoint(out: Path, model: str = "self-forcing", seed: int = 0) -> dict[str, Path]:
    """The four files (module docstring) for ``model``; returns their paths by config field
    (``world.vae``'s TAEHV file as ``taehv``)."""
    cfg = CHECKPOINT_MODELS[model]
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    dit = {k: v.to(torch.bfloat16) for k, v in CausalDiT(cfg).state_dict().items()}
    paths = {
        "checkpoint": out / FILES[model],
        "vae": out / "Wan2.1_VAE.pth",
        "prompt_embeddings": out / "prompts.safetensors",
        "taehv": out / "taew2_1.pth",
    }
    torch.save(peer_layout(dit, ema=model == "self-forcing"), paths["checkpoint"])
    del dit
    vae = WanVAEDecoder(WAN_VAE, cfg.latent_height, cfg.latent_width).state_dict()
    torch.save({wan_name(k): v for k, v in vae.items()}, paths["vae"])
    torch.save(TAEHVDecoder(TAEHV, cfg.latent_height, cfg.latent_width).state_dict(), paths["taehv"])
    g = torch.Generator().manual_seed(seed)
    prompts = {
        p: torch.randn(len(p.split()) + 1, cfg.text_dim, generator=g).to(torch.bfloat16)
        for p in BENCH_PROMPTS
    }
    save_file(prompts, str(paths["prompt_embeddings"]))
    return paths
