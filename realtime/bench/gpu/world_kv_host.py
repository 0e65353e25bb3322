"""Host time of the world KV pool's per-block work at Self-Forcing's layout (30 layers, 3 frames a
block, a sink of 3 and a window of 15 frames): ``KVPool.commit`` of a block and ``KVPool.cross`` of
its prompt K/V, one session in the steady layout (the scratch row holds its slot). Frames of one
token of 8 numbers and a prompt of 4 tokens: the same tensor operations as at the real size, each
moving next to nothing, so what is timed is what Python and the dispatcher spend issuing them,
the part of the DiT stream's `gap` between blocks that the host must cover. Any machine's CPU
(no GPU needed; the meta device would not do: its indexing runs Python decompositions, ~15x the
CPU's dispatch).

    python3 realtime/bench/gpu/world_kv_host.py [OLDER_TREE]

OLDER_TREE (optional): a folder holding an older tree's packages (``git archive <commit> models |
tar -x -C OLDER_TREE``), timed the same way in a process of its own, side by side. Median of 30
blocks after 10 of warm-up; ends with one JSON line (ms per block).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BLOCKS, WARMUP = 40, 10


def measure() -> dict[str, float]:
    """This process's tree: ms per block of ``commit`` and ``cross``."""
    import torch

    from models.world.configs import SELF_FORCING
    from models.world.kv_cache import KVGeometry, KVPool

    layout = dataclasses.replace(SELF_FORCING, latent_height=2, latent_width=2, dim=8, heads=1, text_len=4)
    geometry = KVGeometry.of(layout, torch.bfloat16)
    pool = KVPool(geometry, 2, torch.bfloat16, "cpu")
    pool.reserve_scratch(1)
    pool.open("s")
    room = geometry.frames_per_block * geometry.tokens_per_frame
    times: dict[str, list[float]] = {"commit_ms": [], "cross_ms": []}
    for block in range(BLOCKS):
        start = block * geometry.frames_per_block
        past, _ = pool.gather(["s"], [start], room=room)
        assert past is not None
        kv = [(k[:, -room:], v[:, -room:]) for k, v in past]
        t0 = time.perf_counter()
        pool.commit(["s"], [start], kv)
        t1 = time.perf_counter()
        pool.cross(["s"])
        t2 = time.perf_counter()
        times["commit_ms"].append((t1 - t0) * 1000)
        times["cross_ms"].append((t2 - t1) * 1000)
    return {name: round(statistics.median(values[WARMUP:]), 3) for name, values in times.items()}


def main() -> None:
    if sys.argv[1:] == ["--measure"]:  # the child: the tree it runs in is the one on its path
        print(json.dumps(measure()))
        return
    trees = {"this": Path(__file__).resolve().parents[3]}
    if len(sys.argv) > 1:
        trees = {"older": Path(sys.argv[1]).resolve(), **trees}
    figures: dict[str, float] = {}
    for name, tree in trees.items():
        out = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--measure"],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for key, value in json.loads(out.strip().splitlines()[-1]).items():
            figures[f"{key}_{name}"] = value
    for key, value in figures.items():
        print(f"{key:>20} {value:8.3f}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
