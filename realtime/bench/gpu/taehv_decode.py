"""TAEHV's decoder alone on one GPU: one steady Self-Forcing block (3 latents to 12 frames at
480x832, bf16) in NCHW, channels last (the served layout), with ``cudnn.benchmark``, and compiled
(what ``world.compile`` serves, ``WorldModel.compile_decoder``); CUDA events over 10 calls each.

Run on the device machine from the repo root, after `source realtime/bench/gpu/env.sh` and a
`realtime bench world --model self-forcing --write-random-checkpoint DIR` (its `taew2_1.pth`):
    python3 realtime/bench/gpu/taehv_decode.py DIR/taew2_1.pth
Prints one line per variant and ends with one JSON line (ms per block).
"""

from __future__ import annotations

import json
import sys

import torch

from models.world.taehv import TAEHVDecoder, load_taehv_decoder


def timed_ms(decoder, z: torch.Tensor, state, repeats: int = 10) -> float:
    for _ in range(3):
        decoder(z, state)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        decoder(z, state)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main(path: str) -> None:
    def load() -> TAEHVDecoder:
        return load_taehv_decoder(path, 60, 104, device="cuda", dtype=torch.bfloat16)

    z = torch.randn(1, 3, 16, 60, 104, device="cuda", dtype=torch.bfloat16)
    channels_last = load()
    _, steady = channels_last(z, channels_last.init_state(1))  # a later block's state
    figures = {"nchw_ms": timed_ms(load().to(memory_format=torch.contiguous_format), z, steady)}
    figures["channels_last_ms"] = timed_ms(channels_last, z, steady)
    torch.backends.cudnn.benchmark = True
    figures["channels_last_cudnn_benchmark_ms"] = timed_ms(channels_last, z, steady)
    torch.backends.cudnn.benchmark = False
    channels_last.compile()
    figures["compiled_ms"] = timed_ms(channels_last, z, steady)
    figures = {k: round(v, 2) for k, v in figures.items()}
    for name, ms in figures.items():
        print(f"{name:>36} {ms:8.2f}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main(sys.argv[1])
