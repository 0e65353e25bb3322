"""Self-Forcing with distribution matching: fine-tune the world model on its own rollouts.

A DiT trained with teacher forcing (``train.py`` stage 2) is sampled on its own few-step x0, a
conditional mean that is smoother than a real latent, so the frames soften block after block.
This stage starts from a trained model file and trains the DiT the way it is used:

1. **Self-Forcing rollout** (Huang et al. 2025): every block of a clip is generated with the
   config's few-step sampler (``cfg.sigmas``, fresh noise at each level), the past being the
   generator's own x0 of the earlier blocks, exactly as at inference (a session's first latent
   frame is a real start frame: the clip's own encoded frame 0, pinned as ``sampler.pin_starts``
   does). Passes run in the teacher-forced two-copy layout (``train.TeacherForced``), past =
   the clip generated so far. Only the final denoise pass of every block carries a gradient, in
   one forward over the whole clip with the past detached (Self-Forcing's truncation).
   ``--max-offset``: half the rollouts sit up to that many latent frames into a session (frames
   after the sink move there, as a long session's window does: the sink stays at position 0,
   RoPE's distance to it grows), since a minute of play reaches position 240 and the teacher only
   ever saw the first 8. The scores below judge a clip's content, at the positions they were
   trained at.
2. **DMD** (Yin et al. 2024, DMD2): a frozen copy of the starting DiT is the "real" score, a
   "fake" score DiT initialised from it is trained online with the denoising loss
   (``train.denoising_loss``) on the generator's rollouts, ``--critic-steps`` updates per
   generator update. The generator's x0 is noised to a random level and both scores predict its
   x0 there; the generator's gradient is ``x0_fake - x0_real``, normalised by the mean
   ``|x0 - x0_real|`` per clip (DMD's normaliser), applied as ``0.5 || x0 - sg(x0 - grad) ||^2``.
3. Optional terms (flags, 0 = off): ``--anchor-weight``, stage 2's denoising loss on real
   clips (a regression anchor that keeps the generator conditional on the keys and prompt);
   ``--gan-weight``, a hinge loss from ``train.PatchDiscriminator`` on decoded frames of the
   rollouts against real maze frames (DMD2's GAN term, here in pixel space through the frozen
   decoder). ``--dmd-weight 0`` with a GAN and an anchor is the rollout-GAN variant.
   ``--dec-minutes``: then ``train.py``'s stage 3 (decoder on the new DiT's sampled x0).

The generator kept is the exponential moving average of its weights (``--ema``, 0.99 as
Self-Forcing's; 0: the last step's).

The result is a model file of the starting one's shape (same config: CPU cost per tick
unchanged) with start frames rendered by ``training.start_frames``, followed by the report of
``train.py`` (control response, generated-frame sharpness under ``sharpness.SCRIPT``) and
``training.drift`` (a minute of random keys), as JSON lines, also written to ``--report``.
Command and measured figures: ``weights/README.md``. CPU smoke run (seconds, test-sized shape):
``tests/world/test_self_forcing.py``.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from models.world.configs import (
    WEIGHTS_DIR,
    WorldModelConfig,
    load_model_weights,
    read_config,
)
from models.world.dit import CausalDiT
from models.world.model import WorldModel
from models.world.prompts import WordEmbedding
from models.world.sampler import renoise
from models.world.training.drift import measure_drift
from models.world.training.sharpness import frame_stats, generated_frames, side_by_side
from models.world.training.train import (
    WEIGHT_DTYPES,
    PatchDiscriminator,
    TeacherForced,
    control_response,
    decay_lr,
    denoising_loss,
    encode_dataset,
    load_autoencoder,
    make_dataset,
    normalised_encoder,
    optimize,
    train_decoder_on_samples,
    write_model_file,
)
from models.world.vae import CausalDecoder

DMD_SIGMAS = (0.02, 0.98)  # the noise levels DMD's scores are compared at: uniform in this range


@dataclass
class Clips:
    """A batch of real clips: latents ``z [B, n, C, h, w]`` (frame 0 is the start), per-latent
    actions ``[B, n, A]``, theme ids ``[B]`` and (for the GAN) frames ``[B, 1+4(n-1), 3, H, W]``."""

    z: Tensor
    acts: Tensor
    themes: Tensor
    frames: Tensor


@torch.no_grad()
def self_rollout(
    tf: TeacherForced, start: Tensor, acts: Tensor, themes: Tensor, offset: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Generate a clip block by block from its start latent ``start [B, C, h, w]`` with the
    few-step sampler, each block's past being the generated x0 of the earlier ones. Returns the
    clip's x0 ``[B, n, C, h, w]`` (latent 0 = ``start``) and each block's input to its final
    denoise pass (at ``cfg.sigmas[-1]``): :func:`generator_x0` recomputes that pass with a gradient."""
    cfg, n = tf.cfg, tf.n
    fpb, sigmas = cfg.frames_per_block, cfg.sigmas
    b = start.shape[0]
    clean = torch.zeros(b, n, *start.shape[1:], device=start.device)
    clean[:, 0] = start
    last_input = torch.zeros_like(clean)
    for block in range(n // fpb):
        end = (block + 1) * fpb
        frames = slice(block * fpb, end)
        x = torch.randn_like(clean[:, frames])
        for i, s in enumerate(sigmas):
            noisy = last_input[:, :end].clone()
            noisy[:, frames] = x
            sig = torch.full((b, end), s, device=start.device)
            x0 = tf.prefix(end)(clean[:, :end], noisy, sig, acts[:, :end], themes, offset)[:, frames].float()
            if block == 0:
                x0[:, 0] = start
            if i + 1 < len(sigmas):
                x = renoise(x0, torch.randn_like(x0), sigmas[i + 1])
        last_input[:, frames] = x
        clean[:, frames] = x0
    return clean, last_input


def generator_x0(
    tf: TeacherForced,
    clean: Tensor,
    last_input: Tensor,
    acts: Tensor,
    themes: Tensor,
    offset: Tensor | None = None,
) -> Tensor:
    """The final denoise pass of every block at once, with a gradient (past = ``clean``,
    detached); latent 0 stays the start latent."""
    sig = torch.full(clean.shape[:2], tf.cfg.sigmas[-1], device=clean.device)
    x0 = tf(clean, last_input, sig, acts, themes, offset).float()
    return torch.cat([clean[:, :1], x0[:, 1:]], 1)


def dmd_loss(real: TeacherForced, fake: TeacherForced, x0: Tensor, acts: Tensor, themes: Tensor) -> Tensor:
    """DMD's generator loss for the generated clip ``x0 [B, n, ...]`` (latent 0, the pinned start,
    excluded): both scores at one noise level per clip, past = the clip itself (detached)."""
    past = x0.detach()
    b, n = x0.shape[:2]
    lo, hi = DMD_SIGMAS
    sig = (lo + (hi - lo) * torch.rand(b, 1, device=x0.device)).expand(b, n)
    s = sig[..., None, None, None]
    noisy = (1 - s) * past + s * torch.randn_like(past)
    with torch.no_grad():
        x0_real = real(past, noisy, sig, acts, themes).float()
        x0_fake = fake(past, noisy, sig, acts, themes).float()
    gen, x0_real, x0_fake = x0[:, 1:], x0_real[:, 1:], x0_fake[:, 1:]
    norm = (gen.detach() - x0_real).abs().mean(dim=(1, 2, 3, 4), keepdim=True).clamp(min=1e-6)
    grad = torch.nan_to_num((x0_fake - x0_real) / norm)
    return 0.5 * F.mse_loss(gen, (gen - grad).detach())


def gan_generator_loss(disc: PatchDiscriminator, dec: CausalDecoder, x0: Tensor) -> tuple[Tensor, Tensor]:
    """The generator's hinge term for decoded frames of ``x0`` (frame 0, the start, excluded) and
    those frames (for the discriminator's step)."""
    frames, _ = dec(x0, dec.init_state(x0.shape[0]))
    fake = frames[:, 1:].flatten(0, 1).float()
    return -disc(fake).mean(), fake


def _scores_from(dit: CausalDiT, trainable: bool) -> CausalDiT:
    score = copy.deepcopy(dit)
    return score.train().requires_grad_(True) if trainable else score.eval().requires_grad_(False)


def self_forcing(
    cfg: WorldModelConfig, dit: CausalDiT, words: WordEmbedding, dec: CausalDecoder, data, latents, args
) -> CausalDiT:
    """Train ``dit`` in place on its own rollouts (module docstring) for ``args.steps`` generator
    steps or ``args.minutes``, whichever ends first; returns the generator to keep: the
    exponential moving average of its weights (``args.ema``; Self-Forcing's 0.99) or, without
    one, ``dit`` itself."""
    device, n = args.device, latents.shape[1]
    words.eval().requires_grad_(False)
    dec.eval().requires_grad_(False)
    real = _scores_from(dit, trainable=False)
    fake = _scores_from(dit, trainable=True)
    ema = copy.deepcopy(dit).eval().requires_grad_(False) if args.ema > 0 else None
    dit.train().requires_grad_(True)
    tf_gen, tf_real, tf_fake = (TeacherForced(cfg, m, words, n, device) for m in (dit, real, fake))
    betas = (0.0, 0.999)  # DMD2 / Self-Forcing
    opt = torch.optim.AdamW(dit.parameters(), lr=args.lr, betas=betas, weight_decay=0.01)
    opt_fake = torch.optim.AdamW(fake.parameters(), lr=args.critic_lr, betas=betas, weight_decay=0.01)
    disc = PatchDiscriminator().to(device) if args.gan_weight > 0 else None
    opt_d = torch.optim.AdamW(disc.parameters(), lr=args.critic_lr, betas=(0.5, 0.9)) if disc else None
    g = torch.Generator().manual_seed(args.seed)
    amp = dict(device_type=args.device_type, dtype=torch.bfloat16, enabled=args.amp)
    t0, step = time.time(), 0

    def offsets(b: int) -> Tensor | None:
        """Per clip: 0 (a session's start) or, for half of them, a uniform frame offset up to
        ``--max-offset`` (a clip as generated that far into a session)."""
        if args.max_offset <= 0:
            return None
        late = torch.rand(b, generator=g) < 0.5
        return (late * torch.randint(args.max_offset + 1, (b,), generator=g)).to(device)

    def batch() -> Clips:
        idx = torch.randint(latents.shape[0], (args.batch,), generator=g).to(latents.device)
        return Clips(latents[idx].to(device), data[1][idx].to(device), data[2][idx].to(device), data[0][idx])

    while step < args.steps and time.time() - t0 < args.minutes * 60:
        progress = max(step / args.steps, (time.time() - t0) / (args.minutes * 60))
        decay_lr(opt, args.lr, step, progress)
        logs: dict[str, float] = {}
        if args.dmd_weight > 0:
            for _ in range(args.critic_steps):  # the fake score follows the generator's rollouts
                c = batch()
                with torch.autocast(**amp):
                    clip, _ = self_rollout(tf_gen, c.z[:, 0], c.acts, c.themes, offsets(args.batch))
                    loss_fake = denoising_loss(tf_fake, clip, c.acts, c.themes, context_noise=0.0)
                optimize(opt_fake, loss_fake, clip=list(fake.parameters()))
            logs["critic"] = loss_fake.item()
        c = batch()
        with torch.autocast(**amp):
            offset = offsets(args.batch)
            clean, last_input = self_rollout(tf_gen, c.z[:, 0], c.acts, c.themes, offset)
            x0 = generator_x0(tf_gen, clean, last_input, c.acts, c.themes, offset)
            loss = torch.zeros((), device=device)
            if args.dmd_weight > 0:
                dmd = dmd_loss(tf_real, tf_fake, x0, c.acts, c.themes)
                loss = loss + args.dmd_weight * dmd
                logs["dmd"] = dmd.item()
            if args.anchor_weight > 0:
                anchor = denoising_loss(tf_gen, c.z, c.acts, c.themes, args.context_noise, offset)
                loss = loss + args.anchor_weight * anchor
                logs["anchor"] = anchor.item()
            if disc is not None:
                sub = slice(0, args.gan_batch)
                adv, fake_frames = gan_generator_loss(disc, dec, x0[sub])
                loss = loss + args.gan_weight * adv
                logs["adv"] = adv.item()
        optimize(opt, loss, clip=list(dit.parameters()))
        if ema is not None:
            with torch.no_grad():
                for average, param in zip(ema.parameters(), dit.parameters(), strict=True):
                    average.lerp_(param, 1 - args.ema)
        if disc is not None:  # hinge loss; the generator step above left grads on disc: cleared here
            real_frames = c.frames[sub, 1:].to(device).flatten(0, 1).float() / 255.0
            with torch.autocast(**amp):
                loss_d = F.relu(1 - disc(real_frames)).mean() + F.relu(1 + disc(fake_frames.detach())).mean()
            optimize(opt_d, loss_d)
            logs["disc"] = loss_d.item()
        if step % args.log_every == 0:
            gen_grad = frame_stats(_decoded(dec, clean[:2]), cfg.frame_width)["mean_gradient"]
            line = " ".join(f"{k} {v:.5f}" for k, v in logs.items())
            print(
                f"sf step {step} {line} rollout_gradient {gen_grad:.5f} t={time.time() - t0:.0f}s", flush=True
            )
        step += 1
    print(f"sf done: {step} generator steps in {time.time() - t0:.0f}s", flush=True)
    return ema if ema is not None else dit.eval().requires_grad_(False)


@torch.no_grad()
def _decoded(dec: CausalDecoder, z: Tensor) -> Tensor:
    """Frames ``[T, 3, H, W]`` of clips ``z`` (on the CPU, for statistics)."""
    return dec(z.float(), dec.init_state(z.shape[0]))[0].flatten(0, 1).float().cpu()


def report(path: Path, args) -> dict:
    """The final figures of a model file: control response, sharpness under ``sharpness.SCRIPT``
    and drift over ``args.drift_seconds`` of random keys (``training.drift``)."""
    model = WorldModel.from_weights(path, slots=9, device=args.device)
    out: dict = {"weights": str(path), "control_response": control_response(model)}
    clips = generated_frames(model)
    out["generated"] = {
        k: round(v, 5) for k, v in frame_stats(torch.cat(clips).cpu(), model.cfg.frame_width).items()
    }
    if args.png:
        side_by_side([clips], args.png, model.cfg.frame_width)
    if args.drift_seconds > 0:
        drift_png = args.png.with_name(args.png.stem + "-drift.png") if args.png else None
        out["drift"] = measure_drift(model, seconds=args.drift_seconds, seeds=(0, 1), png=drift_png).to_dict()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--init", type=Path, default=WEIGHTS_DIR / "world-tiny.safetensors", help="model file to start from"
    )
    p.add_argument(
        "--autoencoder", type=Path, default=WEIGHTS_DIR / "world-tiny-autoencoder.safetensors",
        help="its stage-1 autoencoder (encodes real clips and the start frames)",
    )  # fmt: skip
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--clips", type=int, default=2048, help="real clips: start frames, keys, anchor and GAN data"
    )
    p.add_argument("--latents", type=int, default=12, help="latent frames per rollout")
    p.add_argument("--steps", type=int, default=1_000_000, help="generator steps")
    p.add_argument("--minutes", type=float, default=6.0)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-5, help="generator learning rate")
    p.add_argument(
        "--critic-lr", type=float, default=1e-4, help="fake score (and discriminator) learning rate"
    )
    p.add_argument("--critic-steps", type=int, default=3, help="fake-score updates per generator update")
    p.add_argument(
        "--max-offset", type=int, default=0,
        help="rollouts of half the clips sit up to this many latent frames into a session (the sink at 0)",
    )  # fmt: skip
    p.add_argument("--dmd-weight", type=float, default=1.0)
    p.add_argument("--anchor-weight", type=float, default=0.0, help="stage 2's denoising loss on real clips")
    p.add_argument("--context-noise", type=float, default=0.1, help="the anchor's context noise (train.py's)")
    p.add_argument("--gan-weight", type=float, default=0.0, help="patch discriminator on decoded rollouts")
    p.add_argument("--gan-batch", type=int, default=8, help="rollouts per step decoded for the GAN term")
    p.add_argument("--dec-minutes", type=float, default=0.0, help="then train.py's stage 3 for this long")
    p.add_argument("--dec-lr", type=float, default=3e-4)
    p.add_argument("--edge-weight", type=float, default=0.5, help="stage 3's image-gradient L1 weight")
    p.add_argument("--start-frames-per-theme", type=int, default=16)
    p.add_argument("--weights-dtype", choices=sorted(WEIGHT_DTYPES), default="float16")
    p.add_argument("--drift-seconds", type=float, default=60.0, help="of the final drift report; 0: none")
    p.add_argument("--no-report", action="store_true", help="skip the final report")
    p.add_argument("--report", type=Path, help="also write the final report here (JSON)")
    p.add_argument("--png", type=Path, help="sheets of the final report (sharpness script, drift)")
    p.add_argument(
        "--ema", type=float, default=0.99, help="keep this EMA of the generator's weights; 0: the last"
    )
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.device_type = torch.device(args.device).type
    args.amp = args.device_type == "cuda"
    if args.latents < 2 or args.batch < 1 or args.critic_steps < 1 or not 0 <= args.ema < 1:
        p.error("--latents >= 2, --batch >= 1, --critic-steps >= 1 and 0 <= --ema < 1 required")
    torch.manual_seed(args.seed)
    t_start = time.time()
    cfg = read_config(args.init)
    if args.latents % cfg.frames_per_block:
        p.error(f"--latents must be a multiple of frames_per_block ({cfg.frames_per_block})")
    dit, words, dec = CausalDiT(cfg), WordEmbedding(cfg), CausalDecoder(cfg)
    for module, prefix in ((dit, "dit."), (words, "text."), (dec, "decoder.")):
        load_model_weights(module, args.init, prefix)
    dit, words, dec = dit.to(args.device), words.to(args.device), dec.to(args.device)
    enc, ae_dec = load_autoencoder(args.autoencoder, cfg, args.device)
    data = make_dataset(cfg, args.clips, args.latents, args.device, args.seed)
    latents = encode_dataset(cfg, enc, ae_dec, data, args.device)
    print(f"data: {tuple(data[0].shape)} in {time.time() - t_start:.0f}s", flush=True)
    dit = self_forcing(cfg, dit, words, dec, data, latents, args)
    if args.dec_minutes > 0:
        stage3 = argparse.Namespace(**vars(args), dec_steps=1_000_000, ae_batch=args.batch, adv_weight=0.0)
        dec = train_decoder_on_samples(
            cfg,
            dit,
            words,
            dec.train().requires_grad_(True),
            latents,
            data,
            stage3,
            torch.Generator().manual_seed(args.seed),
        )
    write_model_file(args, cfg, dit, dec, words, normalised_encoder(enc, ae_dec), t_start)
    if not args.no_report:
        figures = report(args.out, args)
        print("report:", json.dumps(figures), flush=True)
        if args.report:
            args.report.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
