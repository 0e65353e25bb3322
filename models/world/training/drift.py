"""Drift over a long rollout, measured: does the world stay a maze under a minute of random keys?

"Drift into walls" is the failure where, after some seconds of the model feeding on its own
frames, the scene degenerates into a blurry, wall-coloured image. :func:`measure_drift` plays
``seconds`` of random key presses (:func:`random_key_actions`: a menu action held for 0.5-2 s)
on the model, for several (seed, theme) sessions, and the *same* key sequence on the maze itself
from the *same* start (the start frame a session begins from is frame 0 of a known maze:
``training.start_frames.START_SEED``), and compares the two per window of ``window_s``
seconds, on each latent frame's last pixel frame (one in four: rendering the maze is the CPU cost):

- ``mean_gradient``: :func:`sharpness.frame_stats`'s mean absolute image gradient (blur);
- ``sky`` / ``floor`` / ``wall``: the share of pixels nearest to each part of the theme's palette
  (:func:`palette_classes`; the maze's own frames are classified the same way, so the maze's
  share is the reference, not the truth);
- ``colour_distance``: total-variation distance between the window's colour histograms (model vs
  maze, 4 levels per channel; 0 = same colours, 1 = disjoint).

Pass rule (:func:`passes`), a drift measure: what changes over the minute, not how sharp the
model is (that is ``training.sharpness``'s goal, measured on its own):

- **no decay**: the last window's gradient is at least :data:`DECAY_SHARE` of the model's own
  first window's;
- **no walls**: the last window's wall share is at most :data:`WALL_EXCESS` above the maze's in
  that window (the sky share is reported beside it: a scene drawn with low walls shows there).

The gradient ratio to the maze per window (``gradient_ratio``) is reported as information. A
clip that collapses into a flat wall colour fails both; one that blurs over the minute fails the
first; the maze's own frames, and a model as soft at the end as at the start, pass.

CLI (1-3 minutes per model on the shared 2-core box for the default 2 seeds x 4 themes x 60 s)::

    python -m models.world.training.drift --weights W.safetensors [--seconds 60] [--png sheet.png]

prints one JSON object per model: per-window figures for the model and the maze, the pass
verdict, and ``start_psnr`` (decoded start latent vs the maze's frame 0, which confirms the two
start at the same place).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from models.world.model import WorldModel, WorldTick
from models.world.prompts import tokenize
from models.world.training.env import PALETTES, THEMES, MazeEnv, latent_frames
from models.world.training.sharpness import frame_stats, psnr, side_by_side
from models.world.training.start_frames import start_mazes
from models.world.training.train import sample_block_actions

DECAY_SHARE = 0.9  # the last window's gradient must reach this share of the first window's
WALL_EXCESS = 0.15  # and its wall share may exceed the maze's by at most this much
CLASSES = ("sky", "floor", "wall")
_HIST_LEVELS = 4


def random_key_actions(latents: int, seed: int, hold: tuple[int, int] = (2, 8)) -> Tensor:
    """``[latents, 6]`` actions: training's action menu (``train.sample_block_actions``), each
    drawn action held for a uniform ``hold`` latents (2-8: 0.5-2 s at 4 frames per latent)."""
    g = torch.Generator().manual_seed(seed)
    segments = sample_block_actions(1, latents, g)[0]
    lengths = torch.randint(hold[0], hold[1] + 1, (latents,), generator=g)
    return segments.repeat_interleave(lengths, 0)[:latents]


def _prototypes(theme: str) -> tuple[Tensor, Tensor]:
    """RGB prototypes of each class under ``env.py``'s shading, and their class ids."""
    p = torch.tensor(PALETTES[theme])
    wall_shade = torch.tensor([s * m / (1 + 0.12 * d) for s in (1.0, 0.75) for m in (1.0, 0.55)
                               for d in (0.3, 0.6, 1, 1.5, 2, 3, 4, 6, 8, 12)])  # fmt: skip
    floor_shade = torch.tensor([1 / (1 + 0.15 * d) for d in (1, 1.5, 2, 3, 4, 6, 9, 13, 20)])
    t = torch.linspace(0, 1, 11)[:, None]
    protos = [
        (p[6] * (1 - t) + p[5] * t, 0),
        (p[7][None], 0),
        ((p[3:5, None] * floor_shade[None, :, None]).flatten(0, 1), 1),
        ((p[0:3, None] * wall_shade[None, :, None]).flatten(0, 1), 2),
    ]
    return torch.cat([c for c, _ in protos]), torch.cat([torch.full((len(c),), k) for c, k in protos])


def palette_classes(frames: Tensor, theme: str) -> dict[str, float]:
    """Share of pixels of ``frames [T, 3, H, W]`` (in ``[0, 1]``) nearest to the theme's sky,
    floor and wall colours (with ``env.py``'s distance shading and mortar)."""
    protos, ids = _prototypes(theme)
    pixels = frames.permute(0, 2, 3, 1).reshape(-1, 3).float()
    nearest = ids[torch.cdist(pixels, protos).argmin(1)]
    counts = torch.bincount(nearest, minlength=len(CLASSES)).float() / nearest.numel()
    return dict(zip(CLASSES, counts.tolist(), strict=True))


def colour_histogram(frames: Tensor) -> Tensor:
    """Normalised ``4 x 4 x 4`` RGB histogram of ``frames [T, 3, H, W]`` in ``[0, 1]``."""
    q = (frames.float().clamp(0, 1) * _HIST_LEVELS).long().clamp(max=_HIST_LEVELS - 1)
    index = (q[:, 0] * _HIST_LEVELS + q[:, 1]) * _HIST_LEVELS + q[:, 2]
    hist = torch.bincount(index.flatten(), minlength=_HIST_LEVELS**3).float()
    return hist / hist.sum()


@dataclass
class WindowStats:
    """Figures of one window of frames, pooled over sessions."""

    mean_gradient: float
    sky: float
    floor: float
    wall: float


@dataclass
class DriftReport:
    """Per-window figures of the model and of the maze under the same keys, and the verdict."""

    window_s: float
    model: list[WindowStats] = field(default_factory=list)
    maze: list[WindowStats] = field(default_factory=list)
    colour_distance: list[float] = field(default_factory=list)
    start_psnr: float | None = None

    @property
    def passed(self) -> bool:
        return passes(self.model[0], self.model[-1], self.maze[-1])

    def to_dict(self) -> dict:
        """Every figure, plus ``gradient_ratio`` (model / maze per window, information),
        ``decay`` (last / first window's gradient), ``wall_excess`` and ``sky_excess`` (last
        window, model minus maze) and ``passed``."""
        out = asdict(self)
        out["gradient_ratio"] = [
            m.mean_gradient / max(z.mean_gradient, 1e-9) for m, z in zip(self.model, self.maze, strict=True)
        ]
        last, maze = self.model[-1], self.maze[-1]
        out["decay"] = last.mean_gradient / max(self.model[0].mean_gradient, 1e-9)
        out["wall_excess"] = last.wall - maze.wall
        out["sky_excess"] = last.sky - maze.sky
        out["passed"] = self.passed
        return _rounded(out)


def _rounded(x):
    if isinstance(x, float):
        return round(x, 5)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def passes(first: WindowStats, last: WindowStats, maze_last: WindowStats) -> bool:
    """The pass rule of the module docstring: the model's ``first`` and ``last`` windows, and the
    maze's last window under the same keys."""
    return (
        last.mean_gradient >= DECAY_SHARE * first.mean_gradient and last.wall <= maze_last.wall + WALL_EXCESS
    )


def window_stats(clips: list[Tensor], themes: list[str], size: int) -> WindowStats:
    """Figures of one window: ``clips[i] [T, 3, H, W]`` in ``[0, 1]`` of a session of ``themes[i]``."""
    grad = sum(frame_stats(c, size)["mean_gradient"] for c in clips) / len(clips)
    shares = [palette_classes(c, t) for c, t in zip(clips, themes, strict=True)]
    mean = {k: sum(s[k] for s in shares) / len(shares) for k in CLASSES}
    return WindowStats(grad, **mean)


def _window_distance(a: list[Tensor], b: list[Tensor]) -> float:
    """Total-variation distance of the colour histograms, the mean over sessions."""
    return sum(
        0.5 * float((colour_histogram(x) - colour_histogram(y)).abs().sum())
        for x, y in zip(a, b, strict=True)
    ) / len(a)


@torch.no_grad()
def measure_drift(
    model: WorldModel,
    seconds: float = 60.0,
    window_s: float = 10.0,
    seeds: tuple[int, ...] = (0, 1),
    themes: tuple[str, ...] = THEMES,
    png: Path | None = None,
) -> DriftReport:
    """The model and the maze under the same random keys from the same start (module docstring),
    ``len(seeds) x len(themes)`` sessions side by side. ``model`` needs that many free slots and
    start frames (a model without them starts from noise; it is then compared with random mazes).
    With ``png``, a sheet: per session of the first seed, a maze row and a model row, one frame
    at the end of each window."""
    cfg = model.cfg
    fpb, per_latent = cfg.frames_per_block, cfg.temporal_factor
    latents = round(seconds * cfg.fps / per_latent) // fpb * fpb
    window = min(latents, max(1, round(window_s * cfg.fps / per_latent)))
    sessions = [(f"drift-{theme}-{seed}", seed, theme) for seed in seeds for theme in themes]
    env = _start_env(model, sessions)
    acts = torch.stack(
        [random_key_actions(latents, 1000 + 7 * seed + THEMES.index(t)) for _, seed, t in sessions]
    )
    maze_frames = latent_frames(env, acts, per_latent, last_only=True)
    for sid, seed, _ in sessions:
        model.open(sid, seed)
    report = DriftReport(window_s=window * per_latent / cfg.fps)
    gen: list[list[Tensor]] = [[] for _ in sessions]
    real: list[list[Tensor]] = [[] for _ in sessions]
    sheet: list[list[Tensor]] = [[] for _ in range(2 * len(themes))]
    try:
        for block in range(latents // fpb):
            ticks = [
                WorldTick(sid, block, theme, acts[i, block * fpb])
                for i, (sid, _, theme) in enumerate(sessions)
            ]
            for i, frames in enumerate(model.step(ticks)):  # each latent's last frame, as the maze's
                gen[i].append(frames[0 if block == 0 else per_latent - 1 :: per_latent].permute(0, 3, 1, 2))
            for _ in range(fpb):
                for i, frames in enumerate(next(maze_frames).cpu()):
                    real[i].append((frames * 255).round().to(torch.uint8))
            if block == 0 and model.starts is not None:
                first = [torch.stack([c[0][0] for c in clips]).float() / 255 for clips in (gen, real)]
                report.start_psnr = psnr(*first)
            if ((block + 1) * fpb) % window == 0 or block + 1 == latents // fpb:
                g, r = ([torch.cat(c).float() / 255 for c in clips] for clips in (gen, real))
                names = [t for _, _, t in sessions]
                report.model.append(window_stats(g, names, cfg.frame_width))
                report.maze.append(window_stats(r, names, cfg.frame_width))
                report.colour_distance.append(_window_distance(g, r))
                for k in range(len(themes)):
                    sheet[2 * k].append(r[k][-1:])
                    sheet[2 * k + 1].append(g[k][-1:])
                gen, real = [[] for _ in sessions], [[] for _ in sessions]
    finally:
        for sid, _, _ in sessions:
            model.release(sid)
    if png is not None:
        side_by_side([[torch.cat(row)] for row in sheet], png, cfg.frame_width, every=1)
    return report


def _start_env(model: WorldModel, sessions: list[tuple[str, int, str]]) -> MazeEnv:
    """The mazes the sessions start in: each session's start latent's own maze (``start_mazes``
    row of :meth:`StartFrames.index`), or random mazes of the sessions' themes without start frames."""
    cfg, device = model.cfg, next(model.dit.parameters()).device  # rendered where the model runs
    if model.starts is None:
        themes = [THEMES.index(t) for _, _, t in sessions]
        return MazeEnv(len(sessions), size=cfg.frame_height, seed=0, themes=themes, device=device)
    per_theme = model.starts.latents.shape[0] // len(THEMES)
    rows = [model.starts.index(tokenize(theme, cfg), seed) for _, seed, theme in sessions]
    return start_mazes(cfg.frame_height, per_theme, device=device).select(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", type=Path, nargs="+", required=True)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--themes", nargs="+", choices=THEMES, default=list(THEMES))
    p.add_argument("--png", type=Path, help="sheet of the first model (maze / model rows per theme)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    for i, path in enumerate(args.weights):
        model = WorldModel.from_weights(path, slots=len(args.seeds) * len(args.themes), device=args.device)
        report = measure_drift(
            model,
            args.seconds,
            args.window_s,
            tuple(args.seeds),
            tuple(args.themes),
            args.png if i == 0 else None,
        )
        print(json.dumps({str(path): report.to_dict()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
