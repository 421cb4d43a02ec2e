"""Sliding-window inference with Gaussian blending, for models trained on patches of larger volumes.

A window of ``window`` voxels moves over the input with a step of ``int(window * (1 - overlap))``
(at least 1) along each axis, from 0 to the last start that fits (the last window ends at the border);
the logits of every window are weighted by a Gaussian importance map and summed, then divided by the
summed weights:

    y(v) = sum_w g(v - o_w) f(x[w])(v - o_w) / sum_w g(v - o_w),
    g(u) = prod_a exp(-(u_a - (m_a - 1) / 2)^2 / (2 sigma_a^2)),   sigma_a = sigma_scale * m_a,

with o_w a window's origin and m its size; g is clamped below at 1e-3 (of its maximum 1) so corner
voxels keep a weight. An input smaller than the window along an axis is zero-padded on both sides
first and the padding cut from the output. These are MONAI's ``sliding_window_inference`` conventions
(``mode="gaussian"``, ``sigma_scale=0.125``, ``padding_mode="constant"``); the tests compare with
MONAI, which is not a run-time dependency (importing it costs seconds). A window that covers the whole
input gives exactly the whole-volume forward; for a model whose output at a voxel depends only on that
voxel (pointwise), every overlap gives it too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from medattn.data.base import TaskInfo
from medattn.errors import UserError
from medattn.vocabulary import task_types

SIGMA_SCALE = 0.125
MIN_WEIGHT = 1e-3
DEFAULT_OVERLAP = 0.5


def window_starts(size: int, window: int, overlap: float) -> list[int]:
    """Origins of the windows along one axis of ``size`` >= ``window`` voxels."""
    if window >= size:
        return [0]
    step = max(int(window * (1 - overlap)), 1)
    starts = list(range(0, size - window, step))
    return [*starts, size - window]


def gaussian_weights(window: tuple[int, ...], sigma_scale: float = SIGMA_SCALE) -> torch.Tensor:
    """The importance map g (window) of the module docstring, float32, maximum about 1."""
    weights = torch.ones(())
    for m in window:
        u = torch.arange(m, dtype=torch.float32) - (m - 1) / 2
        weights = weights[..., None] * torch.exp(-(u**2) / (2 * (sigma_scale * m) ** 2))
    return weights.clamp_min(max(float(weights.min()), MIN_WEIGHT))


@torch.no_grad()
def sliding_window_logits(model: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor,
                          window: tuple[int, ...], overlap: float = 0.5, batch_size: int = 1) -> torch.Tensor:
    """inputs (B, C, *S) -> logits (B, K, *S) of ``model`` (B', C, *window) -> (B', K, *window), blended.

    ``batch_size``: windows per forward call. Weights and sums are float32 whatever the logits' dtype.
    """
    spatial = tuple(inputs.shape[2:])
    if len(window) != len(spatial):
        raise ValueError(f"window {tuple(window)} has {len(window)} axes, the input {len(spatial)} ({spatial})")
    if not 0 <= overlap < 1:
        raise ValueError(f"overlap must be in [0, 1), got {overlap}")
    extra = [max(m - n, 0) for n, m in zip(spatial, window)]
    if any(extra):
        inputs = F.pad(inputs, [w for e in reversed(extra) for w in (e // 2, e - e // 2)])
    padded = tuple(inputs.shape[2:])
    weights = gaussian_weights(tuple(window)).to(inputs.device)
    grids = torch.meshgrid(*[torch.tensor(window_starts(n, m, overlap)) for n, m in zip(padded, window)],
                           indexing="ij")
    origins = torch.stack([g.flatten() for g in grids], 1).tolist()  # (num windows, len(S))
    regions = [tuple(slice(o, o + m) for o, m in zip(origin, window)) for origin in origins]
    total = norm = None
    for b in range(inputs.shape[0]):
        for first in range(0, len(regions), batch_size):
            chunk = regions[first:first + batch_size]
            logits = model(torch.stack([inputs[(b, slice(None), *r)] for r in chunk])).float()  # (n, K, *window)
            if total is None:
                total = logits.new_zeros((inputs.shape[0], logits.shape[1], *padded))
                norm = logits.new_zeros(padded)
            for region, out in zip(chunk, logits):
                total[(b, slice(None), *region)] += out * weights
                if b == 0:
                    norm[region] += weights
    crop = tuple(slice(e // 2, e // 2 + n) for e, n in zip(extra, spatial))
    return (total / norm)[(slice(None), slice(None), *crop)]


def patch_shape(config: dict, task: TaskInfo) -> tuple[int, ...] | None:
    """``train.patch_size`` as one size per spatial axis of the task's input (an int repeats), or None.
    A UserError for a task that is not segmentation or a patch with the wrong number of axes."""
    size = config["train"]["patch_size"]
    if size is None:
        return None
    axes = len(task.input_shape) - 1
    if not task_types.of(task.task_type).voxel_labels:
        raise UserError(f"train.patch_size applies to segmentation; this task is {task.task_type}")
    size = [size] * axes if isinstance(size, int) else list(size)
    if len(size) != axes:
        raise UserError(f"train.patch_size {size} has {len(size)} axes; the inputs {tuple(task.input_shape)} "
                        f"have {axes} spatial axes")
    return tuple(size)


def inference_window(config: dict, task: TaskInfo) -> tuple[tuple[int, ...], float] | None:
    """(window, overlap) when predictions go through :func:`sliding_window_logits`, else None.

    ``eval.sliding_window``: null (default) = on exactly when ``train.patch_size`` is set; true needs
    ``train.patch_size`` (the window is the training patch); false = whole-volume forward.
    ``eval.window_overlap``: default 0.5 (nnU-Net's; MONAI's default is 0.25).
    """
    wanted, window = config["eval"]["sliding_window"], patch_shape(config, task)
    if wanted and window is None:
        raise UserError("eval.sliding_window=true needs train.patch_size (the window is the training patch)")
    if wanted is False or window is None:
        return None
    overlap = config["eval"]["window_overlap"]
    return window, DEFAULT_OVERLAP if overlap is None else float(overlap)
