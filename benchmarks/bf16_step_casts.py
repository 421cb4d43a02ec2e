"""The dtype casts one bf16-autocast training step executes: counted work, the same on every machine.

Usage:  python benchmarks/bf16_step_casts.py [--resolutions 224 2048] [--mechanisms softmax seqnorm]
                                             [--out benchmarks/results/bf16_step_casts]

One training step (forward under bf16 autocast, backward of a BCE loss; the optimizer step holds no cast) of the
``vit2d`` preset at each resolution runs on fake tensors (``FakeTensorMode``: shapes and dtypes only, nothing is
computed), so the 2048 px step counts on any CPU in seconds. Every ``aten._to_copy`` that changes the dtype is
counted with the bytes it reads and writes (:class:`medattn.bench.casts.CastRecorder`), split into forward casts of
parameters (autocast's copies of the fp32 weights), other forward casts (activations) and backward casts. seqnorm
is counted twice: with its bf16 core (q, k, v stay bf16) and with the float32 core it had before
(``seqnorm-fp32core``, :func:`medattn.bench.casts.float32_seqnorm_core`: the layer upcasts q, k, v and casts its
output back). A cast inside a registered operator is not seen (its fake runs instead), so the bf16 core's own
block casts (one read of q, k and v in 512-token blocks) are left out.
Writes ``casts.csv`` and ``casts.json`` (with the environment) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from medattn.bench.casts import CastRecorder, float32_seqnorm_core
from medattn.bench.common import environment, write_results
from medattn.models import create_model


def count_step(mechanism: str, resolution: int) -> dict:
    """Casts of one bf16 training step of vit2d at ``resolution`` with ``mechanism`` (``seqnorm-fp32core``: the
    float32 core)."""
    net = create_model("vit2d", attention=mechanism.removesuffix("-fp32core"), img_size=resolution, num_classes=1)
    core = float32_seqnorm_core() if mechanism.endswith("-fp32core") else nullcontext()
    with core, FakeTensorMode(allow_non_fake_inputs=True):  # the model is real (small), the step fake
        images = torch.randn(1, net.in_chans, resolution, resolution)
        with CastRecorder(net.parameters()) as recorder:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = net(images)
            loss = F.binary_cross_entropy_with_logits(logits.float(), torch.zeros(1, 1))
            recorder.phase = "backward"
            loss.backward()
    totals = {kind: [0, 0] for kind in ("forward_parameter", "forward_activation", "backward")}
    for cast in recorder.casts:
        kind = "backward" if cast.phase == "backward" else (
            "forward_parameter" if cast.of_parameter else "forward_activation")
        totals[kind][0] += 1
        totals[kind][1] += cast.nbytes
    row = {"mechanism": mechanism, "resolution": resolution, "tokens": net.pos_embed.shape[1]}
    for kind, (casts, size) in totals.items():
        row.update({f"{kind}_casts": casts, f"{kind}_mib": round(size / 2**20, 1)})
    row["total_mib"] = round(sum(cast.nbytes for cast in recorder.casts) / 2**20, 1)
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
