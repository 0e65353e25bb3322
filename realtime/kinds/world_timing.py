"""Where a world chunk's time goes, stage by stage: ``world_stage_seconds{stage, block}``.

One Prometheus histogram on the server's ``/metrics``, filled while ``world.stage_timing`` is on
(the model's profiler, ``models.world.profiling``, then marks the model stages). Per chunk sent, one observation
for each stage (``block``: ``first`` for a session's chunk 0, the time-to-first-frame path, else
``later``):

- ``queue``: the tick being due (the handler started it: pacing and the generate-ahead credit
  allowed it) -> the DiT engine starting the forward of the batch that holds it;
- ``launch``: the block stage's host time for the forward that made the block (on CUDA, queueing
  its kernels: a launch time near the DiT's device time means the host, not the GPU, sets the pace);
- ``gap``: the DiT stream's time from the previous DiT forward's clean pass to this block's first
  pass (the KV commit and gather and the inputs, a few ms at the Wan shape, plus any idle while
  the host had not yet launched this forward);
- ``idle``: the part of ``gap`` the DiT stream sat idle between the previous forward's KV commit
  and this forward's first work: GPU time lost waiting for the host (``BlockTimings.idle_ms``);
- ``denoise``, ``clean``: the DiT's staged denoise passes and its committing clean pass (device
  time on CUDA, from events read where the decode stage already waits for the GPU);
- ``decode``, ``d2h``: the VAE decoder forward and the frames' copy to host memory (the same);
- ``encode``: the media encode stage's forward for the batch that held the block;
- ``send``: the encoded media ready -> the writer done with it (its queue behind earlier chunks
  and the websocket send);
- ``total``: due -> sent. What the stages above do not cover (the hand-offs between pipeline
  stages, the wait for the next free encode or decode forward) is ``total`` minus their sum
  (``launch`` and ``gap`` are not parts of a chunk's path: the launch overlaps the DiT's device
  time, the gap the previous chunk's).

``models.world.profiling.BlockTimings`` carries the model stages' figures through the pipeline;
``realtime bench world --e2e`` scrapes this histogram per session count (``stage_ms``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from realtime.media.stage import EncodedMedia

METRIC = "world_stage_seconds"
STAGES = ("queue", "launch", "gap", "idle", "denoise", "clean", "decode", "d2h", "encode", "send", "total")
# ~1.25x apart from 1 ms to 30 s: a bench reads p50 and max from the buckets of one run
BUCKETS_MS = (
    1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, 120, 150, 200, 250, 300, 400,
    500, 600, 800, 1000, 1200, 1500, 2000, 2500, 3000, 4000, 5000, 6000, 8000, 10000, 15000, 30000,
)  # fmt: skip


class StageTimer:
    """The world kind's stage histogram; ``observe`` runs on the event loop (a handler's runner)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram(
            METRIC,
            "world chunk time by pipeline stage (realtime/kinds/world_timing.py)",
            ["stage", "block"],
            buckets=tuple(ms / 1000 for ms in BUCKETS_MS),
            registry=registry,
        )

    def observe(self, media: EncodedMedia, first: bool, due: float, ready_at: float, sent_at: float) -> None:
        """One sent chunk: ``due`` / ``ready_at`` / ``sent_at`` are ``time.monotonic()`` values of
        the tick starting, the media being encoded and the writer being done with it."""
        t = media.timings
        if t is None:  # media made outside the model stages: nothing to attribute
            return
        block = "first" if first else "later"
        seconds = {
            "queue": max(0.0, t.started_at - due),
            "launch": t.launch_ms / 1000,
            "gap": t.gap_ms / 1000,
            "idle": t.idle_ms / 1000,
            "denoise": t.denoise_ms / 1000,
            "clean": t.clean_ms / 1000,
            "decode": t.decode_ms / 1000,
            "d2h": t.d2h_ms / 1000,
            "encode": media.encode_ms / 1000,
            "send": max(0.0, sent_at - ready_at),
            "total": max(0.0, sent_at - due),
        }
        for stage in STAGES:
            self.histogram.labels(stage, block).observe(seconds[stage])
