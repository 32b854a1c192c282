"""Moves of loss inputs between dtypes and devices that never wait for the device."""

from __future__ import annotations

import torch


def at_least_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 -> fp32 (heads emit bf16 under autocast); fp32 and fp64 stay as they are."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def host_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor onto `device` without a stream sync: pinned first, as an asynchronous copy
    from pageable memory may still synchronise."""
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)
