"""How loud each residual branch of a ViT preset is at initialisation, per mechanism, with and without LayerScale.

A pre-norm block adds ``attn(norm1(x))`` and ``mlp(norm2(x))`` to its input. If one branch is several times the
stem's tokens at the start, the pooled vector the head reads is that branch's output, not the image's features, and
training first has to undo it (issue 40: the SeqNorm hybrids sat at ln 2 for 30-45 epochs where softmax learned at
once). Prints, for each mechanism and ``init_values``, the mean token norm of the stem's tokens, of each block's
attention and MLP branch (before LayerScale) and of the residual stream after each block, on one batch of the
data set a config names (or SYNTHETIC chest X-rays when none is given)::

    python benchmarks/residual_branch_scale.py --config bench/brain_mri_2d/config.yaml --preset vit2d_small
"""

from __future__ import annotations

import argparse

import torch
import yaml

from medattn.attention import available_attentions
from medattn.data import build_datasets, collate
from medattn.models import create_model


def branch_norms(model: torch.nn.Module, images: torch.Tensor) -> dict[str, list[float]]:
    """Mean token norms at one forward: ``stem`` [1], ``attention`` and ``mlp`` [depth] (each branch before its
    LayerScale), ``stream`` [depth] (the residual stream after each block)."""
    norms = {"stem": [], "attention": [], "mlp": [], "stream": []}
    hooks = [model.patch_embed.register_forward_hook(
        lambda module, inputs, output: norms["stem"].append(output.flatten(2).norm(dim=1).mean().item()))]
    for block in model.encoder.blocks:
        hooks += [block.attn.register_forward_hook(
                      lambda module, inputs, output: norms["attention"].append(output.norm(dim=-1).mean().item())),
                  block.mlp.register_forward_hook(
                      lambda module, inputs, output: norms["mlp"].append(output.norm(dim=-1).mean().item())),
                  block.register_forward_hook(
                      lambda module, inputs, output: norms["stream"].append(output.norm(dim=-1).mean().item()))]
    with torch.no_grad():
        model(images)
    for hook in hooks:
        hook.remove()
    return norms


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="a run config whose data.* builds the batch (default: SYNTHETIC chest X-rays)")
    parser.add_argument("--preset", default="vit2d_small")
    parser.add_argument("--mechanisms", nargs="+", default=["softmax", "sima", "seqnorm"],
                        choices=available_attentions())
    parser.add_argument("--init-values", nargs="+", default=["none", "1e-5"],
                        help="LayerScale starts to compare ('none': no LayerScale)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    data_cfg = (yaml.safe_load(open(args.config))["data"] if args.config
                else {"kind": "synthetic_cxr", "image_size": 64, "num_samples": [args.batch, 4, 4]})
    bundle = build_datasets(data_cfg, seed=args.seed)
    images = collate([bundle.train[i] for i in range(min(args.batch, len(bundle.train)))])["input"]
    task = bundle.task
    print(f"{args.preset} on {tuple(images.shape)} ({data_cfg['kind']}), seed {args.seed}: mean token norms")
    print(f"{'mechanism':10s} {'init_values':>11s} {'stem':>6s}  {'attention branch per block':28s} "
          f"{'MLP branch per block':24s} stream after each block")
    for name in args.mechanisms:
        for value in args.init_values:
            torch.manual_seed(args.seed)
            init_values = None if value == "none" else float(value)
            model = create_model(args.preset, attention=name, num_classes=task.num_outputs,
                                 in_chans=task.input_shape[0], img_size=tuple(task.input_shape[1:]),
                                 init_values=init_values).eval()
            norms = branch_norms(model, images)
            row = lambda values: " ".join(f"{v:6.2f}" for v in values)  # noqa: E731
            print(f"{name:10s} {value:>11s} {norms['stem'][0]:6.2f}  {row(norms['attention']):28s} "
                  f"{row(norms['mlp']):24s} {row(norms['stream'])}")


if __name__ == "__main__":
    main()
