"""Batch normalisation over the global batch when several processes train together, on CPU and GPU alike.

Each process holds a share of every batch (accelerate `split_batches`); plain BatchNorm would normalise with the
share's statistics, so 2 processes would train another model than 1. `GlobalBatchNorm` all-reduces the per-channel
sums (differentiably: `torch.distributed.nn.functional.all_reduce`, whose backward all-reduces the gradients), so
forward, backward and running statistics are those of the whole batch — torch's `SyncBatchNorm` does the same on GPU
only. Modules are switched by class in place (`global_batchnorm`), so parameter names and saved weights are unchanged.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.nn.functional import all_reduce

    return all_reduce(t, op=dist.ReduceOp.SUM)


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics span every process's share of the batch (two-pass mean and variance)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        dims = [0, *range(2, x.dim())]
        shape = [1, -1, *([1] * (x.dim() - 2))]
        xf = x.float()
        count = _all_reduce(torch.tensor([xf.numel() / xf.shape[1]], dtype=torch.float32, device=x.device))
        mean = _all_reduce(xf.sum(dims)) / count
        centred = xf - mean.view(shape)
        var = _all_reduce((centred * centred).sum(dims)) / count
        out = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            self._update_running(mean.detach(), var.detach(), float(count))
        return out.to(x.dtype)

    @torch.no_grad()
    def _update_running(self, mean: torch.Tensor, var: torch.Tensor, count: float) -> None:
        self.num_batches_tracked += 1
        momentum = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        unbiased = var * (count / max(count - 1.0, 1.0))
        self.running_mean.mul_(1 - momentum).add_(mean.to(self.running_mean.dtype), alpha=momentum)
        self.running_var.mul_(1 - momentum).add_(unbiased.to(self.running_var.dtype), alpha=momentum)


_GLOBAL: dict[type, type] = {
    cls: type(f"Global{cls.__name__}", (GlobalBatchNorm, cls), {}) for cls in (nn.BatchNorm1d, nn.BatchNorm2d,
                                                                               nn.BatchNorm3d)
}


@contextmanager
def global_batchnorm(model: nn.Module, enabled: bool = True) -> Iterator[nn.Module]:
    """Within the block, every BatchNorm1d/2d/3d of `model` normalises over the global batch; restored afterwards."""
    switched = []
    if enabled:
        for module in model.modules():
            if type(module) in _GLOBAL:
                switched.append((module, type(module)))
                module.__class__ = _GLOBAL[type(module)]
    try:
        yield model
    finally:
        for module, cls in switched:
            module.__class__ = cls
