"""The optional Hopper attention kernels (FlashAttention-4, FlashAttention-3's forward): which
package each needs, the dtypes it takes, how to install it, and whether it can run here. The
world DiT (``models.world.attention``) chooses among them; pi0's attention takes neither
(FlashAttention-3 was withdrawn from it, docs/models.md)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OptionalKernel:
    """A Hopper attention kernel from an optional package: the modules that must import, the
    dtypes it takes and how to install it."""

    modules: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    install: str


OPTIONAL_KERNELS: dict[str, OptionalKernel] = {
    "flash4": OptionalKernel(
        ("flash_attn", "flash_attn.cute"),
        (torch.bfloat16, torch.float16),
        "the flash4 extra (pip install 'realtime-sessions[flash4]')",
    ),
    # fa3-fwd builds FlashAttention-3's forward without its fp16 kernels
    "flash3": OptionalKernel(
        ("fa3_fwd_interface",),
        (torch.bfloat16,),
        "the flash3 extra (pip install 'realtime-sessions[flash3]')",
    ),
}


def kernel_usable(kernel: str, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> bool:
    """``kernel``'s package is installed, ``device`` is a Hopper GPU (their sm90 forwards) and
    ``dtype`` one it takes."""
    spec = OPTIONAL_KERNELS[kernel]
    return (
        dtype in spec.dtypes
        and device.type == "cuda"
        and torch.cuda.get_device_capability(device)[0] == 9
        and all(importlib.util.find_spec(module) is not None for module in spec.modules)
    )
