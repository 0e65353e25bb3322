"""How sharp world frames are, measured: the numbers behind "sharper" in ``weights/README.md``.

- :func:`frame_stats`: mean absolute image gradient (x and y, all channels, values in ``[0, 1]``)
  and the share of spectral energy above half the Nyquist frequency (radially, mean removed per
  frame), for frames ``[T, 3, H, W]``. Frames of a lower-resolution model are scaled bilinearly
  to ``size`` first (what the page does), so every model is measured at the same resolution.
- :func:`generated_frames` / :func:`env_frames`: the model's frames and the maze's own under one
  scripted action sequence (forward, turns, forward + turn), for several seeds and themes.
- :func:`psnr` for reconstructions (the training script reports the decoder's PSNR on held-out
  clips; generated frames have no pixel-aligned ground truth: the model is not image-conditioned).

CLI (also run at the end of ``models.world.training.train``)::

    python -m models.world.training.sharpness --weights A.safetensors B.safetensors --png side_by_side.png

prints one JSON line of stats per model and for the environment, and with ``--png`` writes a
side-by-side sheet: one row per model (environment first), frames along the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from models.world.configs import read_config
from models.world.model import WorldModel, WorldTick
from models.world.training.env import MazeEnv, rollout

# (action, latent frames held): 1 latent frame = 4 pixel frames; lengths are even so that any
# frames_per_block in {1, 2} splits them into whole blocks
SCRIPT: tuple[tuple[tuple[float, ...], int], ...] = (
    ((0, 0, 0, 0, 0, 0), 2),
    ((1, 0, 0, 0, 0, 0), 4),
    ((0, 0, 1, 0, 0, 0), 2),
    ((1, 0, 0, 1, 0, 0), 2),
    ((0, 0, 0, 1, 0, 0), 2),
)
THEMES_EVAL = ("stone", "forest", "desert", "ice")


def script_actions() -> Tensor:
    """Per latent frame actions of :data:`SCRIPT`, ``[n, 6]``."""
    return torch.cat([torch.tensor(a, dtype=torch.float32).expand(n, -1) for a, n in SCRIPT])


def frame_stats(frames: Tensor, size: int) -> dict[str, float]:
    """``frames [T, 3, H, W]`` in ``[0, 1]`` -> mean |gradient| and high-frequency energy share."""
    x = frames.float()
    if x.shape[-1] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    grad = ((x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., :, 1:] - x[..., :, :-1]).abs().mean()) / 2
    spec = torch.fft.fftshift(torch.fft.fft2(x - x.mean(dim=(-2, -1), keepdim=True)), dim=(-2, -1)).abs() ** 2
    f = torch.fft.fftshift(torch.fft.fftfreq(size))  # cycles per pixel, Nyquist 0.5
    radius = (f[:, None] ** 2 + f[None, :] ** 2).sqrt()
    high = spec[..., radius > 0.25].sum() / spec.sum().clamp(min=1e-12)
    return {"mean_gradient": float(grad), "high_freq_energy": float(high)}


def psnr(a: Tensor, b: Tensor) -> float:
    """PSNR in dB of two frame tensors in ``[0, 1]``."""
    mse = F.mse_loss(a.float(), b.float())
    return float(10 * torch.log10(1.0 / mse.clamp(min=1e-12)))


@torch.no_grad()
def generated_frames(model: WorldModel, seeds: tuple[int, ...] = (0, 1)) -> list[Tensor]:
    """Each (seed, theme) session's frames ``[T, 3, H, W]`` in ``[0, 1]`` under :data:`SCRIPT`."""
    acts, fpb = script_actions(), model.cfg.frames_per_block
    sids = [(f"{theme}-{seed}", seed, theme) for seed in seeds for theme in THEMES_EVAL]
    for sid, seed, _ in sids:
        model.open(sid, seed)
    out: dict[str, list[Tensor]] = {sid: [] for sid, _, _ in sids}
    for block in range(acts.shape[0] // fpb):
        ticks = [WorldTick(sid, block, theme, acts[block * fpb]) for sid, _, theme in sids]
        for (sid, _, _), frames in zip(sids, model.step(ticks), strict=True):
            out[sid].append(frames)
    for sid, _, _ in sids:
        model.release(sid)
    return [torch.cat(out[sid]).permute(0, 3, 1, 2).float() / 255 for sid, _, _ in sids]


def env_frames(size: int, seeds: tuple[int, ...] = (0, 1)) -> list[Tensor]:
    """The maze's own frames under :data:`SCRIPT`, one clip per (seed, theme) as the model's."""
    acts = script_actions()
    clips = []
    for seed in seeds:
        env = MazeEnv(len(THEMES_EVAL), size=size, seed=seed, themes=list(range(len(THEMES_EVAL))))
        clips += list(rollout(env, acts[None].expand(len(THEMES_EVAL), -1, -1)))
    return clips


def mean_stats(clips: list[Tensor], size: int) -> dict[str, float]:
    return {k: round(v, 5) for k, v in frame_stats(torch.cat(clips), size).items()}


def side_by_side(rows: list[list[Tensor]], path: Path, size: int, every: int = 6) -> None:
    """One row per clip list (first clip of each), frames ``every`` apart, scaled to ``size``."""
    from PIL import Image

    lines = []
    for clips in rows:
        clip = clips[0][::every]
        clip = F.interpolate(clip, size=(size, size), mode="bilinear", align_corners=False)
        lines.append(torch.cat(list(clip), dim=-1))
    width = min(line.shape[-1] for line in lines)
    sheet = torch.cat([line[..., :width] for line in lines], dim=-2)
    rgb = (sheet.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    Image.fromarray(rgb).save(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", type=Path, nargs="+", required=True)
    p.add_argument("--size", type=int, default=128, help="resolution every model is measured at")
    p.add_argument("--sigmas", type=float, nargs="+", help="override the sampler's noise levels")
    p.add_argument("--png", type=Path)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    env = env_frames(args.size)
    rows, report = [env], {"environment": mean_stats(env, args.size)}
    for path in args.weights:
        cfg = read_config(path)
        if args.sigmas:
            cfg = dataclasses.replace(cfg, sigmas=tuple(args.sigmas))
        model = WorldModel.build(cfg, slots=8, weights=path, device=args.device)
        clips = generated_frames(model)
        rows.append(clips)
        report[str(path)] = {**mean_stats(clips, args.size), "native_px": cfg.frame_width}
    print(json.dumps(report))
    if args.png:
        side_by_side(rows, args.png, args.size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
