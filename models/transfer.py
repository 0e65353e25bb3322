"""Host-to-device copies that never make the host wait for the device."""

from __future__ import annotations

import torch
from torch import Tensor


def to_device(t: Tensor, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """CPU ``t`` on ``like``'s device, in ``dtype`` (default ``like``'s), queued behind the work
    already on the stream: from pinned memory on CUDA. A plain copy from pageable memory makes
    the host wait until the stream has drained, so the GPU idles while the host prepares and
    launches what follows (between a world block's denoise passes, and between blocks)."""
    t = t.to(like.dtype if dtype is None else dtype)
    if like.device.type == "cuda":
        return t.pin_memory().to(like.device, non_blocking=True)
    return t.to(like.device)
