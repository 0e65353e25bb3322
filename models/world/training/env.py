"""A procedural first-person maze the world model is trained on (batched raycaster in torch).

Each environment is a random maze on a ``grid x grid`` map with one of four themes (the prompt:
``stone``, ``forest``, ``desert``, ``ice``), textured brick walls, a checkered floor and a sky
with a yaw-dependent skyline, so that moving forward (the view expands) and turning (the view
slides sideways) are visibly different. Renders ``[B, 3, H, W]`` in ``[0, 1]`` on CPU or GPU.

Actions, one vector per pixel frame (the model's action layout):
``[forward, back, turn_left, turn_right, mouse_dx, mouse_dy]``; buttons are 0/1, mouse values
are in ``[-1, 1]`` (dx > 0 turns right, dy > 0 looks down). Turning left increases the yaw,
which slides the picture to the right on screen.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterator

import torch
from torch import Tensor

THEMES = ("stone", "forest", "desert", "ice")
ACTION_NAMES = ("forward", "back", "turn_left", "turn_right", "mouse_dx", "mouse_dy")

MOVE_PER_FRAME = 0.09  # cells
TURN_PER_FRAME = math.radians(5.0)
MOUSE_TURN = math.radians(8.0)  # per frame at |dx| = 1
MOUSE_PITCH = 3.0 / 64  # horizon shift per frame at |dy| = 1, as a fraction of the image height
FOV = math.radians(66.0)

# per theme: 3 wall colours, 2 floor colours, sky top, sky horizon, skyline colour
PALETTES = {
    "stone": [(0.55, 0.52, 0.5), (0.45, 0.35, 0.3), (0.62, 0.6, 0.45), (0.3, 0.3, 0.32), (0.5, 0.5, 0.52),
              (0.25, 0.4, 0.75), (0.7, 0.8, 0.95), (0.35, 0.38, 0.45)],
    "forest": [(0.2, 0.5, 0.2), (0.4, 0.3, 0.15), (0.3, 0.6, 0.35), (0.15, 0.3, 0.1), (0.3, 0.45, 0.2),
               (0.3, 0.55, 0.7), (0.75, 0.9, 0.8), (0.1, 0.3, 0.15)],
    "desert": [(0.85, 0.7, 0.4), (0.75, 0.5, 0.3), (0.9, 0.8, 0.6), (0.8, 0.65, 0.4), (0.65, 0.5, 0.3),
               (0.95, 0.6, 0.3), (1.0, 0.9, 0.6), (0.6, 0.35, 0.2)],
    "ice": [(0.7, 0.85, 0.95), (0.5, 0.6, 0.85), (0.9, 0.95, 1.0), (0.85, 0.9, 0.95), (0.6, 0.7, 0.8),
            (0.05, 0.1, 0.3), (0.4, 0.5, 0.8), (0.8, 0.85, 1.0)],
}  # fmt: skip


def make_mazes(batch: int, grid: int, rng: random.Random) -> Tensor:
    """Random perfect mazes (iterative DFS on odd cells) with extra openings: ``[B, grid, grid]`` 1 = wall."""
    cells = (grid - 1) // 2
    out = []
    for _ in range(batch):
        walls = [[1] * grid for _ in range(grid)]
        seen = {(0, 0)}
        stack = [(0, 0)]
        walls[1][1] = 0
        while stack:
            cy, cx = stack[-1]
            options = [
                (cy + dy, cx + dx)
                for dy, dx in ((0, 1), (1, 0), (0, -1), (-1, 0))
                if 0 <= cy + dy < cells and 0 <= cx + dx < cells and (cy + dy, cx + dx) not in seen
            ]
            if not options:
                stack.pop()
                continue
            ny, nx = rng.choice(options)
            seen.add((ny, nx))
            walls[2 * ny + 1][2 * nx + 1] = 0
            walls[cy + ny + 1][cx + nx + 1] = 0
            stack.append((ny, nx))
        for y in range(1, grid - 1):
            for x in range(1, grid - 1):
                if rng.random() < 0.3:
                    walls[y][x] = 0
        out.append(walls)
    return torch.tensor(out, dtype=torch.uint8)


class MazeEnv:
    def __init__(
        self,
        batch: int,
        size: int = 128,
        grid: int = 15,
        seed: int = 0,
        themes: list[int] | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.size, self.grid, self.device = size, grid, torch.device(device)
        maps = make_mazes(batch, grid, random.Random(seed))
        self.maps = maps.to(self.device)
        self.theme = torch.tensor(
            themes if themes is not None else torch.randint(len(THEMES), (batch,), generator=g).tolist(),
            device=self.device,
        )
        pal = torch.tensor([PALETTES[t] for t in THEMES], dtype=torch.float32)
        self.palette = pal.to(self.device)[self.theme]  # [B, 8, 3]
        self.wall_hash = torch.randint(3, (batch, grid, grid), generator=g).to(self.device)
        start = []
        for b in range(batch):
            free = (maps[b] == 0).nonzero()
            start.append(free[int(torch.randint(len(free), (1,), generator=g))])
        start = torch.stack(start).float().to(self.device) + 0.5
        self.pos = start[:, [1, 0]].clone()  # (x, y) in cells
        self.yaw = (torch.rand(batch, generator=g) * 2 * math.pi).to(self.device)
        self.pitch = torch.zeros(batch, device=self.device)

    @property
    def batch(self) -> int:
        return self.maps.shape[0]

    def select(self, rows: list[int]) -> MazeEnv:
        """A new environment of mazes ``rows`` of this one, in their current state."""
        sub = copy.copy(self)
        index = torch.tensor(rows, device=self.device)
        for name in ("maps", "theme", "palette", "wall_hash", "pos", "yaw", "pitch"):
            setattr(sub, name, getattr(self, name)[index].clone())
        return sub

    def _wall(self, x: Tensor, y: Tensor) -> Tensor:
        b = torch.arange(self.batch, device=self.device).view(-1, *([1] * (x.dim() - 1))).expand_as(x)
        xi = x.long().clamp(0, self.grid - 1)
        yi = y.long().clamp(0, self.grid - 1)
        return self.maps[b, yi, xi] > 0

    def step(self, action: Tensor) -> None:
        """Advance one pixel frame with ``action [B, 6]``."""
        a = action.to(self.device, torch.float32)
        self.yaw = self.yaw + (a[:, 2] - a[:, 3]) * TURN_PER_FRAME - a[:, 4] * MOUSE_TURN
        self.pitch = (self.pitch + a[:, 5] * MOUSE_PITCH * self.size).clamp(-self.size / 5, self.size / 5)
        speed = (a[:, 0] - a[:, 1]) * MOVE_PER_FRAME
        d = torch.stack([self.yaw.cos(), -self.yaw.sin()], -1)
        for axis in (0, 1):  # slide along walls: move each axis separately, with a margin
            new = self.pos.clone()
            new[:, axis] += speed * d[:, axis]
            probe = new.clone()
            probe[:, axis] += 0.2 * torch.sign(speed * d[:, axis])
            ok = ~self._wall(probe[:, 0], probe[:, 1])
            self.pos = torch.where(ok[:, None], new, self.pos)

    def render(self) -> Tensor:
        s, dev = self.size, self.device
        cols = (torch.arange(s, device=dev) + 0.5) / s * 2 - 1  # [-1, 1] left -> right
        plane = math.tan(FOV / 2)
        ang = self.yaw[:, None] - torch.atan(cols * plane)[None, :]  # [B, W]
        dx, dy = ang.cos(), -ang.sin()
        dist, side, u, cell_x, cell_y = self._cast(dx, dy)
        perp = dist * torch.cos(ang - self.yaw[:, None])
        height = (s / perp.clamp(min=1e-3)).clamp(max=8 * s)  # [B, W]
        rows = torch.arange(s, device=dev)[None, :, None].float() + 0.5  # [1, H, 1]
        horizon = s / 2 + self.pitch[:, None, None]
        top = horizon - height[:, None, :] / 2
        v = (rows - top) / height[:, None, :]  # [B, H, W] in [0, 1] on the wall
        is_wall = (v >= 0) & (v <= 1)

        b_idx = torch.arange(self.batch, device=dev)[:, None]
        wall_id = self.wall_hash[b_idx, cell_y.clamp(0, self.grid - 1), cell_x.clamp(0, self.grid - 1)]
        wall_col = self.palette[b_idx, wall_id]  # [B, W, 3]
        brick_row = (v * 4).floor()
        uu = u[:, None, :] * 2 + 0.5 * (brick_row % 2)
        mortar = ((v * 4) % 1 < 0.12) | ((uu % 1) < 0.08)
        shade = torch.where(side[:, None, :], 0.75, 1.0) / (1 + 0.12 * perp[:, None, :])
        wall = wall_col[:, None, :, :] * (shade * torch.where(mortar, 0.55, 1.0))[..., None]

        below = rows - horizon  # floor rows have below > 0
        row_dist = (s / 2) / below.clamp(min=1e-3) / torch.cos(ang - self.yaw[:, None])[:, None, :]
        fx = self.pos[:, 0, None, None] + dx[:, None, :] * row_dist
        fy = self.pos[:, 1, None, None] + dy[:, None, :] * row_dist
        checker = ((fx * 2).floor() + (fy * 2).floor()) % 2
        floor_col = torch.where(
            checker[..., None] > 0, self.palette[:, None, None, 3], self.palette[:, None, None, 4]
        )
        floor = floor_col / (1 + 0.15 * row_dist[..., None].clamp(max=20))

        t = ((horizon - rows) / (s / 2)).clamp(0, 1)[..., None]  # 0 at horizon, 1 at top
        sky = self.palette[:, None, None, 6] * (1 - t) + self.palette[:, None, None, 5] * t
        skyline = (0.18 + 0.1 * torch.sin(3 * ang) + 0.06 * torch.sin(7 * ang + 1.0))[:, None, :]
        hills = (t[..., 0] < skyline) & (below < 0)
        sky = torch.where(hills[..., None], self.palette[:, None, None, 7], sky)

        img = torch.where(is_wall[..., None], wall, torch.where((below > 0)[..., None], floor, sky))
        return img.clamp(0, 1).permute(0, 3, 1, 2).contiguous()

    def _cast(self, dx: Tensor, dy: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """DDA ray cast per column: distance, side (y-side hit), texture u, hit cell."""
        px = self.pos[:, 0, None].expand_as(dx)
        py = self.pos[:, 1, None].expand_as(dy)
        map_x, map_y = px.floor().long(), py.floor().long()
        inv_x = 1.0 / torch.where(dx.abs() < 1e-9, torch.full_like(dx, 1e-9), dx)
        inv_y = 1.0 / torch.where(dy.abs() < 1e-9, torch.full_like(dy, 1e-9), dy)
        step_x = torch.where(dx < 0, -1, 1)
        step_y = torch.where(dy < 0, -1, 1)
        side_x = torch.where(dx < 0, (px - map_x) * -inv_x, (map_x + 1 - px) * inv_x)
        side_y = torch.where(dy < 0, (py - map_y) * -inv_y, (map_y + 1 - py) * inv_y)
        delta_x, delta_y = inv_x.abs(), inv_y.abs()
        hit = torch.zeros_like(dx, dtype=torch.bool)
        dist = torch.full_like(dx, float(self.grid * 2))
        side = torch.zeros_like(hit)
        for _ in range(self.grid * 2):
            go_x = side_x < side_y
            d_now = torch.where(go_x, side_x, side_y)
            map_x = torch.where(go_x & ~hit, map_x + step_x, map_x)
            map_y = torch.where(~go_x & ~hit, map_y + step_y, map_y)
            side_x = torch.where(go_x & ~hit, side_x + delta_x, side_x)
            side_y = torch.where(~go_x & ~hit, side_y + delta_y, side_y)
            new_hit = ~hit & self._wall_cells(map_x, map_y)
            dist = torch.where(new_hit, d_now, dist)
            side = torch.where(new_hit, ~go_x, side)
            hit = hit | new_hit
            if bool(hit.all()):
                break
        hx = px + dx * dist
        hy = py + dy * dist
        u = torch.where(side, hx, hy) % 1.0
        return dist, side, u, map_x, map_y

    def _wall_cells(self, map_x: Tensor, map_y: Tensor) -> Tensor:
        b = torch.arange(self.batch, device=self.device)[:, None].expand_as(map_x)
        inside = (map_x >= 0) & (map_x < self.grid) & (map_y >= 0) & (map_y < self.grid)
        return ~inside | (self.maps[b, map_y.clamp(0, self.grid - 1), map_x.clamp(0, self.grid - 1)] > 0)


def latent_frames(
    env: MazeEnv, latent_actions: Tensor, temporal_factor: int = 4, last_only: bool = False
) -> Iterator[Tensor]:
    """The frames of each of ``n`` latent frames in turn, ``[B, frames, 3, H, W]``: latent 0 is
    frame 0 (before any action), latent ``i >= 1`` the ``temporal_factor`` frames rendered after
    each step under action ``latent_actions[:, i]`` (so pixel frame ``t`` has latent ``ceil(t / 4)``'s).
    ``last_only``: render only each latent's last frame (a quarter of the rendering cost)."""
    yield env.render()[:, None]
    for i in range(1, latent_actions.shape[1]):
        frames = []
        for k in range(temporal_factor):
            env.step(latent_actions[:, i])
            if not last_only or k + 1 == temporal_factor:
                frames.append(env.render())
        yield torch.stack(frames, 1)


def rollout(env: MazeEnv, latent_actions: Tensor, temporal_factor: int = 4) -> Tensor:
    """Render ``1 + 4(n-1)`` frames for ``n`` latent frames (:func:`latent_frames`).
    Returns ``[B, frames, 3, H, W]``."""
    return torch.cat(list(latent_frames(env, latent_actions, temporal_factor)), 1)


def horizontal_shift(frames: Tensor) -> Tensor:
    """Mean horizontal image shift between consecutive frames ``[T, 3, H, W]``, in pixels.

    Positive = content moves right (what turning left does). Estimated per frame pair by the
    best-matching shift of the column-mean profile of the upper half (sky and wall tops), over
    shifts up to an eighth of the width (a turn moves the view by about W / 13 per frame).
    """
    max_shift = frames.shape[-1] // 8
    prof = frames[:, :, : frames.shape[2] // 2].mean(dim=(1, 2))  # [T, W]
    prof = prof - prof.mean(-1, keepdim=True)
    shifts = []
    for a, b in zip(prof[:-1], prof[1:], strict=True):
        best, best_err = 0, float("inf")
        for sh in range(-max_shift, max_shift + 1):
            if sh >= 0:
                err = (b[sh:] - a[: a.numel() - sh]).pow(2).mean()
            else:
                err = (b[:sh] - a[-sh:]).pow(2).mean()
            if float(err) < best_err:
                best, best_err = sh, float(err)
        shifts.append(best)
    return torch.tensor(shifts, dtype=torch.float32).mean()
