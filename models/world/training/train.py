"""Train the embedded world model on the procedural maze (``models/world/training/env.py``).

Two stages, each bounded by steps and minutes:

1. **autoencoder**: a per-group conv encoder (4 pixel frames -> 1 latent; the first latent from
   frame 0 alone) and the causal decoder of ``vae.py``, trained to reconstruct whole clips; then
   the per-channel latent mean/std are stored in the decoder so the DiT sees unit-scale latents;
2. **causal DiT** with teacher forcing in the two-copy layout: the sequence is
   ``[clean latents ; noisy latents]``; clean tokens attend block-causally (sink + window) among
   clean tokens with sigma = 0, exactly what the resident KV holds at inference; noisy tokens of
   block ``b`` attend to their own noisy block and the visible clean past. The loss is the x0
   error on the noisy copy, at noise levels drawn from the sampler's schedule and uniformly;
3. **decoder on sampled latents** (DiT frozen): at inference the decoder only ever sees the
   sampler's x0, which is smoother than an encoder latent (a few-step x0 is a conditional mean),
   so the decoder is fine-tuned on exactly that — the staged denoise passes of the sampler run in
   the teacher-forced layout — against the true frames, with the edge-aware reconstruction loss
   plus (``--adv-weight``) a hinge loss from a small patch discriminator that rewards the brick
   mortar and floor checks a pixel loss averages away.

The model file also gets start frames (``models.world.training.start_frames``: encoded maze frames a session's first
block begins from, ``--start-frames-per-theme``). Data: random mazes, themes (the prompt) and
per-block actions, rendered into a pool of clips of
``1 + 4(n - 1)`` frames up front. The result is one safetensors file (``dit.*``, ``decoder.*``,
config in the metadata), float16 by default (``--weights-dtype``; it loads as float32). The shape
flags (``--latent-channels``, ``--dim``, ``--heads``, ``--depth``, ``--ffn-dim``,
``--decoder-channels``, ``--decoder-res-levels``) override ``TINY``'s fields. Runs on CPU (tiny
and slow: ``--clips 8 --ae-steps 2 --dit-steps 2 --dec-steps 2``) or GPU. At the end it prints the held-out PSNR and sharpness of the decoder
(``models.world.training.sharpness``), the sharpness of generated frames and the control response.
Stage 1 alone can run in one process and stages 2-3 in another: ``--autoencoder-only
--save-autoencoder AE.safetensors`` then ``--autoencoder AE.safetensors`` (the encoder, which the
model file does not keep, travels in that file). Exact command and time of the committed
weights: ``weights/README.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.world.configs import (
    TINY,
    WEIGHTS_DIR,
    WorldModelConfig,
    load_model_weights,
    read_config,
    save_model_weights,
)
from models.world.dit import CausalDiT, block_causal_mask
from models.world.model import WorldModel, WorldTick
from models.world.prompts import WordEmbedding, tokenize
from models.world.training.env import THEMES, MazeEnv, horizontal_shift, rollout
from models.world.training.sharpness import frame_stats, generated_frames, psnr, side_by_side
from models.world.training.start_frames import render_start_frames
from models.world.vae import CausalDecoder

# per-block action menu: (probability, [forward, back, left, right, mouse_dx, mouse_dy])
_MENU = [
    (0.30, [1, 0, 0, 0, 0, 0]),
    (0.14, [0, 0, 1, 0, 0, 0]),
    (0.14, [0, 0, 0, 1, 0, 0]),
    (0.08, [1, 0, 1, 0, 0, 0]),
    (0.08, [1, 0, 0, 1, 0, 0]),
    (0.06, [0, 1, 0, 0, 0, 0]),
    (0.08, [0, 0, 0, 0, 0, 0]),
    (0.08, "mouse_dx"),
    (0.04, "mouse_dy"),
]


def sample_block_actions(batch: int, blocks: int, g: torch.Generator) -> Tensor:
    probs = torch.tensor([p for p, _ in _MENU])
    choice = torch.multinomial(probs, batch * blocks, replacement=True, generator=g).view(batch, blocks)
    out = torch.zeros(batch, blocks, 6)
    for i, (_, a) in enumerate(_MENU):
        sel = choice == i
        if a == "mouse_dx":
            out[..., 4] = torch.where(sel, torch.rand(batch, blocks, generator=g) * 2 - 1, out[..., 4])
        elif a == "mouse_dy":
            out[..., 5] = torch.where(sel, torch.rand(batch, blocks, generator=g) * 2 - 1, out[..., 5])
        else:
            out[sel] = torch.tensor(a, dtype=torch.float32)
    return out


def make_dataset(cfg: WorldModelConfig, clips: int, latents: int, device: str, seed: int, chunk: int = 512):
    """Clips ``uint8 [N, 1+4(n-1), 3, H, W]``, per-latent actions ``[N, n, 6]``, theme ids ``[N]``."""
    g = torch.Generator().manual_seed(seed)
    blocks = math.ceil(latents / cfg.frames_per_block)
    frames, acts, themes = [], [], []
    for start in range(0, clips, chunk):
        n = min(chunk, clips - start)
        env = MazeEnv(n, size=cfg.frame_height, seed=seed * 7919 + start, device=device)
        block_actions = sample_block_actions(n, blocks, g)
        latent_actions = block_actions.repeat_interleave(cfg.frames_per_block, 1)[:, :latents]
        clip = rollout(env, latent_actions.to(device), cfg.temporal_factor)
        frames.append((clip * 255).round().to(torch.uint8))
        acts.append(latent_actions.to(device))
        themes.append(env.theme)
    return torch.cat(frames), torch.cat(acts), torch.cat(themes)


class GroupEncoder(nn.Module):
    """Frames ``[B, 1+4(n-1), 3, H, W]`` -> latents ``[B, n, C, h, w]`` (training only)."""

    def __init__(self, cfg: WorldModelConfig) -> None:
        super().__init__()
        self.tf, self.factor = cfg.temporal_factor, cfg.spatial_factor
        # twice the decoder's widths: the encoder only runs in training, so capacity is free
        ch = [3 * cfg.temporal_factor, *(2 * c for c in reversed(cfg.decoder_channels))]
        layers: list[nn.Module] = []
        for c_in, c_out in zip(ch[:-1], ch[1:], strict=True):
            layers += [nn.Conv2d(c_in, c_out, 4, stride=2, padding=1), nn.SiLU()]
        layers += [
            nn.Conv2d(ch[-1], ch[-1], 3, padding=1),
            nn.SiLU(),
            nn.Conv2d(ch[-1], cfg.latent_channels, 1),
        ]
        self.net = nn.Sequential(*layers)

    def forward(self, frames: Tensor) -> Tensor:
        b, t, c, h, w = frames.shape
        first = frames[:, :1].expand(b, self.tf, c, h, w)
        groups = torch.cat([first, frames[:, 1:]], 1).view(b, -1, self.tf * c, h, w)
        n = groups.shape[1]
        x = groups.flatten(0, 1).contiguous(memory_format=torch.channels_last)
        return self.net(x).reshape(b, n, -1, h // self.factor, w // self.factor)


def train_mask(cfg: WorldModelConfig, n: int, device) -> Tensor:
    """Token mask of the two-copy sequence ``[clean 0..n-1 ; noisy 0..n-1]``."""
    f = torch.arange(n, device=device)
    full = block_causal_mask(f, f, cfg.frames_per_block, cfg.sink_frames, cfg.window_frames)
    same = (f[:, None] // cfg.frames_per_block) == (f[None, :] // cfg.frames_per_block)
    top = torch.cat([full, torch.zeros_like(full)], 1)
    bottom = torch.cat([full & ~same, same], 1)
    frame_mask = torch.cat([top, bottom], 0)
    t = cfg.tokens_per_frame
    return frame_mask.repeat_interleave(t, 0).repeat_interleave(t, 1)


def _batch(data, bs: int, device: str, g: torch.Generator):
    frames, acts, themes = data
    idx = torch.randint(frames.shape[0], (bs,), generator=g).to(frames.device)
    return frames[idx].to(device).float() / 255.0, acts[idx].to(device), themes[idx].to(device)


def decay_lr(opt: torch.optim.Optimizer, lr: float, step: int, progress: float) -> None:
    """Warm-up over 200 steps, then linear decay to 10% at ``progress`` 1 (of steps or minutes)."""
    for group in opt.param_groups:
        group["lr"] = lr * min(1.0, (step + 1) / 200) * (1 - 0.9 * min(progress, 1.0))


def optimize(opt: torch.optim.Optimizer, loss: Tensor, clip: list[Tensor] | None = None) -> None:
    """One optimizer step on ``loss`` (gradient norm clipped to 1 over ``clip`` if given)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(clip, 1.0)
    opt.step()


def _gradients(x: Tensor) -> tuple[Tensor, Tensor]:
    return x[..., 1:, :] - x[..., :-1, :], x[..., :, 1:] - x[..., :, :-1]


def reconstruction_loss(recon: Tensor, frames: Tensor, edge_weight: float = 0.5) -> Tensor:
    """MSE + 0.5 L1 on pixels, plus L1 on the image gradients: a pixel loss alone is minimised by
    blurring edges the latent cannot place exactly; the gradient term pays for sharp ones."""
    edges = sum(F.l1_loss(r, f) for r, f in zip(_gradients(recon), _gradients(frames), strict=True))
    return F.mse_loss(recon, frames) + 0.5 * F.l1_loss(recon, frames) + edge_weight * edges


class PatchDiscriminator(nn.Module):
    """Frames ``[N, 3, H, W]`` -> real/fake logits per 8x8-pixel patch (training only)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for c_in, c_out in ((3, width), (width, 2 * width), (2 * width, 4 * width)):
            layers += [nn.Conv2d(c_in, c_out, 4, stride=2, padding=1), nn.LeakyReLU(0.2)]
        self.net = nn.Sequential(*layers, nn.Conv2d(4 * width, 1, 3, padding=1))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x * 2 - 1)


def train_autoencoder(cfg, data, args, g) -> tuple[GroupEncoder, CausalDecoder]:
    enc, dec = GroupEncoder(cfg).to(args.device), CausalDecoder(cfg).to(args.device)
    opt = torch.optim.AdamW([*enc.parameters(), *dec.parameters()], lr=args.ae_lr, weight_decay=0.0)
    t0, step = time.time(), 0
    while step < args.ae_steps and time.time() - t0 < args.ae_minutes * 60:
        decay_lr(
            opt, args.ae_lr, step, max(step / args.ae_steps, (time.time() - t0) / (args.ae_minutes * 60))
        )
        frames, _, _ = _batch(data, args.ae_batch, args.device, g)
        with torch.autocast(args.device_type, dtype=torch.bfloat16, enabled=args.amp):
            z = enc(frames)
            z = z + 0.05 * torch.randn_like(z)  # robustness to DiT sampling error
            recon, _ = dec(z, dec.init_state(frames.shape[0]))
        loss = reconstruction_loss(recon.float(), frames, args.edge_weight)
        optimize(opt, loss)
        if step % 200 == 0:
            print(f"ae step {step} loss {loss.item():.5f} t={time.time() - t0:.0f}s", flush=True)
        step += 1
    print(f"ae done: {step} steps in {time.time() - t0:.0f}s, loss {loss.item():.5f}", flush=True)
    with torch.no_grad():
        frames, _, _ = _batch(data, min(256, data[0].shape[0]), args.device, g)
        z = enc(frames)
        dec.latent_mean.copy_(z.mean(dim=(0, 1, 3, 4)))
        dec.latent_std.copy_(z.std(dim=(0, 1, 3, 4)) + 1e-4)
    return enc, dec


def normalised_encoder(enc: GroupEncoder, dec: CausalDecoder) -> Callable[[Tensor], Tensor]:
    """Frames ``[B, 1+4(n-1), 3, H, W]`` in ``[0, 1]`` -> latents at the DiT's unit scale (the
    decoder's fitted mean/std), without gradients."""

    @torch.no_grad()
    def encode(frames: Tensor) -> Tensor:
        return (enc(frames) - dec.latent_mean[:, None, None]) / dec.latent_std[:, None, None]

    return encode


def encode_dataset(cfg, enc, dec, data, device) -> Tensor:
    frames, encode = data[0], normalised_encoder(enc, dec)
    return torch.cat(
        [encode(frames[i : i + 256].to(device).float() / 255.0) for i in range(0, frames.shape[0], 256)]
    )


def train_dit(cfg, latents: Tensor, data, args, g) -> tuple[CausalDiT, WordEmbedding]:
    """The DiT and its word-prompt table (``models.world.prompts``), trained together."""
    dit, words = CausalDiT(cfg).to(args.device), WordEmbedding(cfg).to(args.device)
    params = [*dit.parameters(), *words.parameters()]
    opt = torch.optim.AdamW(params, lr=args.dit_lr, weight_decay=0.01)
    tf = TeacherForced(cfg, dit, words, latents.shape[1], args.device)
    t0, step = time.time(), 0
    while step < args.dit_steps and time.time() - t0 < args.dit_minutes * 60:
        decay_lr(
            opt, args.dit_lr, step, max(step / args.dit_steps, (time.time() - t0) / (args.dit_minutes * 60))
        )
        idx = torch.randint(latents.shape[0], (args.dit_batch,), generator=g).to(latents.device)
        z, acts, themes = (
            latents[idx].to(args.device),
            data[1][idx].to(args.device),
            data[2][idx].to(args.device),
        )
        with torch.autocast(args.device_type, dtype=torch.bfloat16, enabled=args.amp):
            loss = denoising_loss(tf, z, acts, themes, args.context_noise)
        optimize(opt, loss, clip=params)
        if step % 500 == 0:
            print(f"dit step {step} loss {loss.item():.5f} t={time.time() - t0:.0f}s", flush=True)
        step += 1
    print(f"dit done: {step} steps in {time.time() - t0:.0f}s, loss {loss.item():.5f}", flush=True)
    return dit, words


def denoising_loss(
    tf: TeacherForced,
    z: Tensor,
    acts: Tensor,
    themes: Tensor,
    context_noise: float,
    offset: Tensor | None = None,
) -> Tensor:
    """Stage 2's loss on clips ``z [B, n, C, h, w]``: the x0 error of the noisy copy, each block at
    a noise level drawn from the sampler's schedule or uniformly (half each, at least 0.02), the
    clean past ``z`` with noise of a std drawn from ``[0, context_noise)`` per clip (``offset``:
    :meth:`TeacherForced.__call__`'s)."""
    cfg, (b, n), device = tf.cfg, z.shape[:2], z.device
    blocks = n // cfg.frames_per_block
    pick = torch.randint(len(cfg.sigmas), (b, blocks), device=device)
    sig_block = torch.where(
        torch.rand(b, blocks, device=device) < 0.5,
        torch.tensor(cfg.sigmas, device=device)[pick],
        torch.rand(b, blocks, device=device),
    ).clamp(min=0.02)
    sig = sig_block.repeat_interleave(cfg.frames_per_block, 1)
    noisy = (1 - sig[..., None, None, None]) * z + sig[..., None, None, None] * torch.randn_like(z)
    noise = context_noise * torch.rand(b, 1, 1, 1, 1, device=device)
    x0 = tf(z + noise * torch.randn_like(z), noisy, sig, acts, themes, offset)
    return F.mse_loss(x0.float(), z.float())


class TeacherForced:
    """The DiT in the two-copy training layout for clips of ``n`` latents (mask, positions, prompts)."""

    def __init__(
        self, cfg: WorldModelConfig, dit: CausalDiT, words: WordEmbedding, n: int, device: str
    ) -> None:
        self.cfg, self.dit, self.words, self.n = cfg, dit, words, n
        self.mask = train_mask(cfg, n, device)
        self.pos = torch.arange(n, device=device).repeat(2)[None]
        self.tokens = torch.stack([tokenize(t, cfg) for t in THEMES]).to(device)
        self._prefixes: dict[int, TeacherForced] = {n: self}

    def prefix(self, n: int) -> TeacherForced:
        """The same DiT over the first ``n`` latents (a causal block sees no later one, so its
        output is the full layout's): what a rollout's early blocks need, at less cost."""
        if n not in self._prefixes:
            self._prefixes[n] = TeacherForced(self.cfg, self.dit, self.words, n, self.pos.device)
        return self._prefixes[n]

    def __call__(
        self,
        clean: Tensor,
        noisy: Tensor,
        sig: Tensor,
        acts: Tensor,
        themes: Tensor,
        offset: Tensor | None = None,
    ) -> Tensor:
        """x0 predicted for ``noisy [B, n, ...]`` at per-latent ``sig [B, n]``, past = ``clean``
        (the DiT's flow prediction at timesteps ``1000 sig``: ``x0 = x - sig v``). ``offset [B]``:
        every frame after the sink frames sits that many frames later (the clip as seen at
        inference that far into a session, where the sink keeps position 0)."""
        b = clean.shape[0]
        sigma = torch.cat([torch.zeros_like(sig), sig], 1)
        cross = self.dit.cross_kv(self.words.embedding(self.tokens[themes]))
        x = torch.cat([clean, noisy], 1)
        pos = self.pos.expand(b, -1)
        if offset is not None:
            pos = pos + offset[:, None] * (pos >= self.cfg.sink_frames)
        flow, _ = self.dit(x, pos, 1000 * sigma, acts.repeat(1, 2, 1), cross, self.mask)
        x0 = x - sigma[..., None, None, None] * flow
        return x0[:, self.n :]

    @torch.no_grad()
    def sample(self, z: Tensor, acts: Tensor, themes: Tensor) -> Tensor:
        """The sampler's staged denoise passes (``cfg.sigmas``, fresh noise at each level) for
        every block of ``z`` at once, the true latents as the clean past: the x0 the decoder sees."""
        x = torch.randn_like(z)
        x0 = x
        for i, s in enumerate(self.cfg.sigmas):
            x0 = self(z, x, torch.full(z.shape[:2], s, device=z.device), acts, themes)
            if i + 1 < len(self.cfg.sigmas):
                nxt = self.cfg.sigmas[i + 1]
                x = (1 - nxt) * x0 + nxt * torch.randn_like(z)
        return x0


def train_decoder_on_samples(cfg, dit, words, dec, latents, data, args, g) -> CausalDecoder:
    """Stage 3 (module docstring): the decoder learns to draw sharp frames from sampled x0."""
    frozen = dit.eval().requires_grad_(False), words.eval().requires_grad_(False)
    tf = TeacherForced(cfg, *frozen, latents.shape[1], args.device)
    disc = PatchDiscriminator().to(args.device)
    opt = torch.optim.AdamW(dec.parameters(), lr=args.dec_lr, weight_decay=0.0)
    opt_d = torch.optim.AdamW(disc.parameters(), lr=args.dec_lr, betas=(0.5, 0.9))
    t0, step = time.time(), 0
    while step < args.dec_steps and time.time() - t0 < args.dec_minutes * 60:
        decay_lr(
            opt, args.dec_lr, step, max(step / args.dec_steps, (time.time() - t0) / (args.dec_minutes * 60))
        )
        idx = torch.randint(latents.shape[0], (args.ae_batch,), generator=g).to(latents.device)
        frames = data[0][idx].to(args.device).float() / 255.0
        z, acts, themes = (
            latents[idx].to(args.device),
            data[1][idx].to(args.device),
            data[2][idx].to(args.device),
        )
        with torch.autocast(args.device_type, dtype=torch.bfloat16, enabled=args.amp):
            x0 = tf.sample(z, acts, themes)
            recon, _ = dec(x0, dec.init_state(z.shape[0]))
        recon = recon.float()
        loss = reconstruction_loss(recon, frames, args.edge_weight)
        fake, real = recon.flatten(0, 1), frames.flatten(0, 1)
        if args.adv_weight > 0:
            loss = loss - args.adv_weight * disc(fake).mean()
        optimize(opt, loss)
        if args.adv_weight > 0:  # hinge loss; the decoder step above left grads on disc: cleared here
            optimize(opt_d, F.relu(1 - disc(real)).mean() + F.relu(1 + disc(fake.detach())).mean())
        if step % 200 == 0:
            print(f"dec step {step} loss {loss.item():.5f} t={time.time() - t0:.0f}s", flush=True)
        step += 1
    print(f"dec done: {step} steps in {time.time() - t0:.0f}s", flush=True)
    return dec.eval()


@torch.no_grad()
def heldout_report(cfg, enc, dit, words, dec, args) -> dict[str, float]:
    """PSNR and sharpness (``models.world.training.sharpness``) on held-out clips: the autoencoder's
    reconstruction and (with a ``dit``) the decode of the sampler's teacher-forced x0, against the
    true frames. With ``args.png``, a sheet of the first held-out clip (rows: truth, recon, sampled)."""
    data = make_dataset(cfg, args.heldout, args.latents, args.device, args.seed + 1)
    frames = data[0].float() / 255.0
    z = encode_dataset(cfg, enc, dec, data, args.device)
    outputs = {"recon": dec(z, dec.init_state(z.shape[0]))[0]}
    if dit is not None:
        tf = TeacherForced(cfg, dit, words, z.shape[1], args.device)
        outputs["sampled"] = dec(tf.sample(z, data[1], data[2]), dec.init_state(z.shape[0]))[0]
    size = cfg.frame_width
    report = {f"truth_{k}": v for k, v in frame_stats(frames.flatten(0, 1).cpu(), size).items()}
    for name, out in outputs.items():
        report[f"{name}_psnr"] = psnr(out.float(), frames)
        report.update(
            {f"{name}_{k}": v for k, v in frame_stats(out.float().flatten(0, 1).cpu(), size).items()}
        )
    if args.png:
        rows = [[x[0].float().cpu()] for x in (frames, *outputs.values())]
        side_by_side(rows, args.png, 2 * size, every=4)
    return {k: round(v, 5) for k, v in report.items()}


AUTOENCODER_FIELDS = (
    "latent_channels", "latent_height", "latent_width", "decoder_channels", "decoder_res_levels",
    "temporal_factor",
)  # fmt: skip


def save_autoencoder(path: Path, cfg: WorldModelConfig, enc: GroupEncoder, dec: CausalDecoder) -> None:
    """Stage 1's result (encoder, decoder, fitted latent statistics; float32) for a later
    ``--autoencoder`` run: the encoder is needed to train a DiT and is not in the model file."""
    tensors = {f"encoder.{k}": v.float().cpu() for k, v in enc.state_dict().items()}
    tensors.update({f"decoder.{k}": v.float().cpu() for k, v in dec.state_dict().items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model_weights(path, cfg, tensors)


def load_autoencoder(path: Path, cfg: WorldModelConfig, device: str) -> tuple[GroupEncoder, CausalDecoder]:
    """The encoder and decoder :func:`save_autoencoder` wrote; their shape fields must match ``cfg``."""
    saved = read_config(path)
    wrong = [k for k in AUTOENCODER_FIELDS if getattr(saved, k) != getattr(cfg, k)]
    if wrong:
        raise SystemExit(f"{path}: autoencoder shape differs from the flags in {', '.join(wrong)}")
    enc, dec = GroupEncoder(cfg), CausalDecoder(cfg)
    load_model_weights(enc, path, "encoder.")
    load_model_weights(dec, path, "decoder.")
    return enc.to(device), dec.to(device)


CONTROL_PROBES = {
    "forward": [1.0, 0, 0, 0, 0, 0],
    "turn_left": [0, 0, 1.0, 0, 0, 0],
    "turn_right": [0, 0, 0, 1.0, 0, 0],
}


@torch.no_grad()
def control_response(
    model: WorldModel, seeds=(0, 1, 2), warmup: int = 1, blocks: int = 3
) -> dict[str, float]:
    """Mean horizontal image shift (pixels per frame, + = content moves right) of generated frames
    after each probe action, averaged over seeds; turning left must give > 0, right < 0."""
    sids = [(name, seed) for name in CONTROL_PROBES for seed in seeds]
    for name, seed in sids:
        model.open(f"{name}-{seed}", seed)
    frames: dict[tuple[str, int], list[Tensor]] = {s: [] for s in sids}
    for b in range(warmup + blocks):
        ticks = [
            WorldTick(f"{n}-{s}", b, "stone", torch.tensor(CONTROL_PROBES[n] if b >= warmup else [0.0] * 6))
            for n, s in sids
        ]
        for key, out in zip(sids, model.step(ticks), strict=True):
            if b >= warmup:
                frames[key].append(out)
    for name, seed in sids:
        model.release(f"{name}-{seed}")
    result = {}
    for name in CONTROL_PROBES:
        shifts = [
            horizontal_shift(torch.cat(frames[(name, s)]).permute(0, 3, 1, 2).float() / 255) for s in seeds
        ]
        result[name] = float(torch.stack(shifts).mean())
    return result


def write_model_file(
    args: argparse.Namespace,
    cfg: WorldModelConfig,
    dit: CausalDiT,
    dec: CausalDecoder,
    words: WordEmbedding,
    encode: Callable[[Tensor], Tensor],
    started: float,
) -> None:
    """``args.out``: the DiT, decoder and word table in ``args.weights_dtype``, plus
    ``args.start_frames_per_theme`` start frames per theme encoded by ``encode``
    (:func:`normalised_encoder`); prints its size and the time since ``started``."""
    tensors = {f"dit.{k}": v.float().cpu() for k, v in dit.state_dict().items()}
    tensors.update({f"decoder.{k}": v.float().cpu() for k, v in dec.state_dict().items()})
    tensors.update({f"text.{k}": v.float().cpu() for k, v in words.state_dict().items()})
    if args.start_frames_per_theme:
        starts = render_start_frames(
            cfg, encode, lambda w: tokenize(w, cfg), args.start_frames_per_theme, device=args.device
        )
        tensors.update(starts.tensors())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_model_weights(args.out, cfg, tensors, WEIGHT_DTYPES[args.weights_dtype])
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({size / 1e6:.2f} MB) total {time.time() - started:.0f}s", flush=True)


# WorldModelConfig fields a flag of the same name (dashes for underscores) overrides
SHAPE_FIELDS = ("latent_channels", "dim", "heads", "depth", "ffn_dim", "decoder_res_levels")
WEIGHT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def shape_config(args: argparse.Namespace) -> WorldModelConfig:
    """TINY with the shape flags given on the command line (validated)."""
    changes = {k: getattr(args, k) for k in SHAPE_FIELDS if getattr(args, k) is not None}
    if args.decoder_channels:
        changes["decoder_channels"] = tuple(args.decoder_channels)
    cfg = dataclasses.replace(TINY, **changes)
    cfg = dataclasses.replace(cfg, rope_dims=(cfg.head_dim, 0, 0))  # world-tiny's RoPE: the frame index alone
    cfg.validate()
    return cfg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=WEIGHTS_DIR / "world-tiny.safetensors")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--clips", type=int, default=4096)
    p.add_argument("--latents", type=int, default=8, help="latent frames per training clip")
    p.add_argument("--ae-steps", type=int, default=100_000)
    p.add_argument("--ae-minutes", type=float, default=2.0)
    p.add_argument("--ae-batch", type=int, default=32)
    p.add_argument("--ae-lr", type=float, default=1e-3)
    p.add_argument("--dit-steps", type=int, default=1_000_000)
    p.add_argument("--dit-minutes", type=float, default=4.0)
    p.add_argument("--dit-batch", type=int, default=64)
    p.add_argument("--dit-lr", type=float, default=5e-4)
    p.add_argument("--dec-steps", type=int, default=100_000, help="stage 3: decoder on sampled latents")
    p.add_argument("--dec-minutes", type=float, default=1.0)
    p.add_argument("--dec-lr", type=float, default=3e-4)
    p.add_argument("--edge-weight", type=float, default=0.5, help="image-gradient L1 weight")
    p.add_argument("--adv-weight", type=float, default=0.0, help="stage 3 patch-discriminator weight")
    p.add_argument("--decoder-channels", type=int, nargs="+", help="override TINY's decoder widths")
    for name in SHAPE_FIELDS:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"override TINY's {name}")
    p.add_argument(
        "--weights-dtype",
        choices=sorted(WEIGHT_DTYPES),
        default="float16",
        help="stored dtype (loads as float32)",
    )
    p.add_argument(
        "--context-noise",
        type=float,
        default=0.03,
        help="stage 2: the clean past gets noise of a std drawn from [0, this) per clip "
        "(robustness to the model's own x0 as context at inference)",
    )
    p.add_argument(
        "--start-frames-per-theme",
        type=int,
        default=16,
        help="encoded maze frames per theme that sessions start from (models.world.start_frames); 0: none",
    )
    p.add_argument("--save-autoencoder", type=Path, help="also write stage 1's encoder + decoder here")
    p.add_argument("--autoencoder", type=Path, help="skip stage 1: load a --save-autoencoder file")
    p.add_argument("--autoencoder-only", action="store_true", help="stop after stage 1 and its report")
    p.add_argument("--png", type=Path, help="sheet of a held-out clip: truth, reconstruction, sampled")
    p.add_argument("--heldout", type=int, default=64, help="held-out clips of the final report")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.device_type = torch.device(args.device).type
    args.amp = args.device_type == "cuda"
    torch.backends.cudnn.benchmark = True  # fixed conv shapes: autotune once (no effect on CPU)
    cfg = shape_config(args)
    print(f"config: {cfg.to_json()}", flush=True)
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    t_start = time.time()
    data = make_dataset(cfg, args.clips, args.latents, args.device, args.seed)
    print(f"dataset: {tuple(data[0].shape)} in {time.time() - t_start:.0f}s", flush=True)
    if args.autoencoder:
        enc, dec = load_autoencoder(args.autoencoder, cfg, args.device)
    else:
        enc, dec = train_autoencoder(cfg, data, args, g)
    if args.save_autoencoder:
        save_autoencoder(args.save_autoencoder, cfg, enc, dec)
    if args.autoencoder_only:
        print("held-out:", json.dumps(heldout_report(cfg, enc, None, None, dec, args)), flush=True)
        return 0
    latents = encode_dataset(cfg, enc, dec, data, args.device)
    dit, words = train_dit(cfg, latents, data, args, g)
    dec = train_decoder_on_samples(cfg, dit, words, dec, latents, data, args, g)
    write_model_file(args, cfg, dit, dec, words, normalised_encoder(enc, dec), t_start)
    print("held-out:", json.dumps(heldout_report(cfg, enc, dit, words, dec, args)), flush=True)
    model = WorldModel.from_weights(args.out, slots=9, device=args.device)
    print("control response (px/frame):", control_response(model), flush=True)
    sharp = frame_stats(torch.cat(generated_frames(model)).cpu(), cfg.frame_width)
    print("generated frames:", json.dumps({k: round(v, 5) for k, v in sharp.items()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
