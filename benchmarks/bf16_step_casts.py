"""The dtype casts one bf16-autocast training step executes: counted work, the same on every machine.

Usage:  python benchmarks/bf16_step_casts.py [--resolutions 224 2048] [--mechanisms softmax seqnorm]
                                             [--out benchmarks/results/bf16_step_casts]

One training step (forward under bf16 autocast, backward of a BCE loss; the optimizer step holds no cast) of the
``vit2d`` preset at each resolution runs on fake tensors (``FakeTensorMode``: shapes and dtypes only, nothing is
computed), so the 2048 px step counts on any CPU in seconds. Every ``aten._to_copy`` that changes the dtype is
counted with the bytes it reads and writes, split into parameter casts (autocast's copies of the fp32 weights) and
activation casts (everything else). seqnorm is counted twice: with its bf16 core (q, k, v stay bf16) and with the
float32 core it had before (``seqnorm-fp32core``: ``LOW_PRECISION`` emptied, so the layer upcasts q, k, v and casts
its output back). A cast inside a registered operator (the bf16 core's per-block upcasts) is not seen: its fake
runs instead, so the bf16 core's own block casts (one read of q, k and v in 512-token blocks) are left out.
Writes ``casts.csv`` and ``casts.json`` (with the environment) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from medattn.attention import seqnorm_fused
from medattn.bench.common import environment, write_results
from medattn.models import create_model


class CastCounter(TorchDispatchMode):
    """Counts dtype-changing ``_to_copy`` calls and the bytes they read and write, by phase: forward casts of
    parameters (autocast's weight copies), other forward casts (activations) and backward casts (set ``phase``)."""

    def __init__(self, parameters):
        super().__init__()
        self.parameter_ids = {id(p) for p in parameters}
        self.phase = "forward"
        self.totals = {kind: [0, 0] for kind in ("forward_parameter", "forward_activation", "backward")}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and out.dtype != args[0].dtype:
            kind = "backward" if self.phase == "backward" else (
                "forward_parameter" if id(args[0]) in self.parameter_ids else "forward_activation")
            self.totals[kind][0] += 1
            self.totals[kind][1] += args[0].numel() * (args[0].element_size() + out.element_size())
        return out


def count_step(mechanism: str, resolution: int) -> dict:
    """Casts of one bf16 training step of vit2d at ``resolution`` with ``mechanism`` (``seqnorm-fp32core``: the
    float32 core)."""
    attention = mechanism.removesuffix("-fp32core")
    low_precision = seqnorm_fused.LOW_PRECISION
    if mechanism.endswith("-fp32core"):
        seqnorm_fused.LOW_PRECISION = ()
    try:
        net = create_model("vit2d", attention=attention, img_size=resolution, num_classes=1)  # real, small
        with FakeTensorMode(allow_non_fake_inputs=True):
            images = torch.randn(1, net.in_chans, resolution, resolution)
            with CastCounter(net.parameters()) as counter:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = net(images)
                loss = F.binary_cross_entropy_with_logits(logits.float(), torch.zeros(1, 1))
                counter.phase = "backward"
                loss.backward()
    finally:
        seqnorm_fused.LOW_PRECISION = low_precision
    row = {"mechanism": mechanism, "resolution": resolution, "tokens": net.pos_embed.shape[1]}
    for kind, (casts, size) in counter.totals.items():
        row.update({f"{kind}_casts": casts, f"{kind}_mib": round(size / 2**20, 1)})
    row["total_mib"] = round(sum(size for _, size in counter.totals.values()) / 2**20, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolutions", type=int, nargs="+", default=[224, 2048])
    parser.add_argument("--mechanisms", nargs="+", default=["softmax", "seqnorm", "seqnorm-fp32core"])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/bf16_step_casts"))
    args = parser.parse_args()
    rows = [count_step(mechanism, resolution) for resolution in args.resolutions for mechanism in args.mechanisms]
    for row in rows:
        print(json.dumps(row))
    write_results(rows, args.out, "casts", environment("bf16 (fake tensors: counted, not timed)"))


if __name__ == "__main__":
    main()
