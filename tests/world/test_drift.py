"""``models.world.training.drift``: the pass rule catches drift (decay, walls), not a steady softness."""

from __future__ import annotations

import torch

from models.world.configs import TEST
from models.world.model import WorldModel
from models.world.training.drift import (
    DriftReport,
    colour_histogram,
    measure_drift,
    palette_classes,
    passes,
    random_key_actions,
    window_stats,
)
from models.world.training.env import PALETTES, MazeEnv, rollout


def _maze_clips(themes: list[int]) -> list[torch.Tensor]:
    env = MazeEnv(len(themes), size=64, seed=3, themes=themes)
    return list(rollout(env, random_key_actions(6, seed=0)[None].expand(len(themes), -1, -1)))


def test_the_maze_passes_and_a_clip_that_collapses_into_wall_or_blur_fails():
    names = ["stone", "desert"]
    maze = window_stats(_maze_clips([0, 2]), names, 64)
    assert passes(maze, maze, maze)
    assert 0.2 < maze.wall < 0.95 and maze.sky > 0.02 and maze.floor > 0.02  # every part of a view is there
    # ending as a flat image of each theme's first wall colour: no edges, all wall
    flat = [torch.tensor(PALETTES[t][0])[None, :, None, None].expand(5, 3, 64, 64) for t in names]
    collapsed = window_stats(flat, names, 64)
    assert collapsed.wall == 1.0 and collapsed.mean_gradient == 0.0
    assert not passes(maze, collapsed, maze)
    # ending as a blurred maze keeps the colours but loses the edges: fails on the decay alone
    blurred = [torch.nn.functional.avg_pool2d(c, 9, stride=1, padding=4) for c in _maze_clips([0, 2])]
    soft = window_stats(blurred, names, 64)
    assert abs(soft.wall - maze.wall) < 0.15 and not passes(maze, soft, maze)
    # as soft at the end as at the start: no drift (sharpness is training.sharpness's goal)
    assert passes(soft, soft, maze)


def test_the_report_gives_the_rule_s_figures_and_the_gradient_ratio_to_the_maze():
    names = ["stone", "desert"]
    maze = window_stats(_maze_clips([0, 2]), names, 64)
    flat = [torch.tensor(PALETTES[t][0])[None, :, None, None].expand(5, 3, 64, 64) for t in names]
    collapsed = window_stats(flat, names, 64)
    figures = DriftReport(10.0, model=[maze, collapsed], maze=[maze, maze]).to_dict()
    assert figures["passed"] is False and figures["decay"] == 0.0 and figures["gradient_ratio"] == [1.0, 0.0]
    assert figures["wall_excess"] == round(1.0 - maze.wall, 5)
    assert figures["sky_excess"] == round(-maze.sky, 5)


def test_histograms_keys_and_palette_shares_are_well_formed():
    clip = _maze_clips([1])[0]
    hist = colour_histogram(clip)
    assert hist.shape == (64,) and abs(float(hist.sum()) - 1) < 1e-5
    shares = palette_classes(clip, "forest")
    assert abs(sum(shares.values()) - 1) < 1e-5
    keys = random_key_actions(40, seed=5)
    assert keys.shape == (40, 6) and torch.equal(keys, random_key_actions(40, seed=5))
    # held keys: far fewer changes than latents
    assert int((keys[1:] != keys[:-1]).any(-1).sum()) < 20


def test_measure_drift_runs_model_and_maze_side_by_side_in_windows(tmp_path):
    model = WorldModel.build(TEST, slots=2)  # random weights, no start frames: random mazes
    report = measure_drift(
        model, seconds=2.0, window_s=1.0, seeds=(0,), themes=("stone", "ice"), png=tmp_path / "d.png"
    )
    assert isinstance(report, DriftReport) and len(report.model) == len(report.maze) == 2
    figures = report.to_dict()
    assert figures["passed"] in (True, False) and len(figures["gradient_ratio"]) == 2
    assert all(0 <= d <= 1 for d in figures["colour_distance"]) and (tmp_path / "d.png").stat().st_size > 0
    assert not model.sessions  # the measure releases its sessions
