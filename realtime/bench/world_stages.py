"""The per-stage breakdown of ``realtime bench world --e2e``: ``world_stage_seconds`` scraped from
the server's ``/metrics`` before and after a run, and summarised from the difference.

Histogram buckets (``realtime.kinds.world_timing.BUCKETS_MS``, about 1.25x apart) bound what a
scrape can say: ``p50`` is interpolated inside its bucket (Prometheus' ``histogram_quantile``),
``max`` is the upper bound of the highest bucket holding a sample of the run (``None`` past the
last bound). ``mean`` (the later blocks) and ``first_block`` (the first blocks) are exact means,
from ``_sum`` / ``_count``: what compares two runs whose samples share a bucket (the p50 of a
272 ms and of a 250 ms denoise both lie in the (250, 300] bucket).
"""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from realtime.kinds.world_timing import METRIC, STAGES


@dataclass
class StageSeries:
    """One ``(stage, block)`` series: cumulative bucket counts by upper bound, sum, count."""

    buckets: dict[float, float] = field(default_factory=dict)
    total: float = 0.0
    count: float = 0.0

    def minus(self, before: StageSeries | None) -> StageSeries:
        if before is None:
            return self
        return StageSeries(
            {le: n - before.buckets.get(le, 0.0) for le, n in self.buckets.items()},
            self.total - before.total,
            self.count - before.count,
        )

    def quantile(self, q: float) -> float | None:
        """Seconds at quantile ``q`` (linear inside the bucket); ``None`` without samples."""
        if self.count <= 0:
            return None
        rank, lower, below = q * self.count, 0.0, 0.0
        for le, cumulative in sorted(self.buckets.items()):
            if cumulative >= rank:
                if math.isinf(le):
                    return lower
                inside = cumulative - below
                return lower + (le - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = le, cumulative
        return lower

    def max_bound(self) -> float | None:
        """Upper bound (s) of the highest bucket holding a sample; ``None``: none, or past the last."""
        top, below = None, 0.0
        for le, cumulative in sorted(self.buckets.items()):
            if cumulative > below:
                top = le
            below = cumulative
        return None if top is None or math.isinf(top) else top


Scrape = dict[tuple[str, str], StageSeries]


def scrape(http_base: str) -> Scrape:
    """``world_stage_seconds`` of the server at ``http_base`` by ``(stage, block)``."""
    with urllib.request.urlopen(f"{http_base}/metrics", timeout=10) as response:
        return parse(response.read().decode())


def parse(text: str) -> Scrape:
    """``world_stage_seconds`` by ``(stage, block)`` from a Prometheus text exposition."""
    series: Scrape = {}
    for family in text_string_to_metric_families(text):
        if family.name != METRIC:
            continue
        for sample in family.samples:
            key = (sample.labels.get("stage", ""), sample.labels.get("block", ""))
            entry = series.setdefault(key, StageSeries())
            if sample.name.endswith("_bucket"):
                entry.buckets[float(sample.labels["le"])] = sample.value
            elif sample.name.endswith("_sum"):
                entry.total = sample.value
            elif sample.name.endswith("_count"):
                entry.count = sample.value
    return series


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _mean_ms(series: StageSeries) -> float | None:
    return _ms(series.total / series.count) if series.count > 0 else None


Breakdown = dict[str, dict[str, float | None] | int]


def breakdown(before: Scrape, after: Scrape) -> Breakdown:
    """Per stage, in ms, over the run between the scrapes: ``mean``, ``p50`` and ``max`` of the
    later blocks, ``first_block`` the mean of the first blocks; ``n`` / ``n_first``: blocks counted."""
    out: Breakdown = {"mean": {}, "p50": {}, "max": {}, "first_block": {}}
    counts = {"later": 0.0, "first": 0.0}
    for stage in STAGES:
        later = after.get((stage, "later"), StageSeries()).minus(before.get((stage, "later")))
        first = after.get((stage, "first"), StageSeries()).minus(before.get((stage, "first")))
        out["mean"][stage] = _mean_ms(later)  # type: ignore[index]
        out["p50"][stage] = _ms(later.quantile(0.5))  # type: ignore[index]
        out["max"][stage] = _ms(later.max_bound())  # type: ignore[index]
        out["first_block"][stage] = _mean_ms(first)  # type: ignore[index]
        counts = {"later": later.count, "first": first.count}  # the same for every stage
    out["n"], out["n_first"] = int(counts["later"]), int(counts["first"])
    return out


def format_breakdown(label: str, figures: Breakdown) -> str:
    """A few printable lines: one row per stage (ms)."""

    def cell(value: float | None) -> str:
        return f"{value:>9.1f}" if value is not None else f"{'-':>9}"

    lines = [
        f"  stages, {label} (ms; {figures['n']} later blocks mean / p50 / max bucket, "
        f"{figures['n_first']} first blocks mean)"
    ]
    for stage in STAGES:
        row = [figures[key][stage] for key in ("mean", "p50", "max", "first_block")]  # type: ignore[index]
        lines.append(f"  {stage:>8} " + " ".join(cell(value) for value in row))
    return "\n".join(lines)
