"""How the attention core's output scale changes with the sequence length N, per mechanism.

A mechanism whose output shrinks with N contributes almost nothing beside the residual path on long
sequences (whole-slide bags of thousands of instances), so the class token learns nothing from the
bag. Random inputs with a common offset (as real embeddings have), default initialisation, dim 64,
4 heads, one seed; prints the RMS of ``attend(q, k, v)`` for each N::

    python benchmarks/attention_output_scale.py --seq-lens 16 256 4096 16384
"""

from __future__ import annotations

import argparse

import torch

from medattn.attention import available_attentions, build_attention


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechanisms", nargs="+", default=["softmax", "sima", "seqnorm", "linear"],
                        choices=available_attentions())
    parser.add_argument("--seq-lens", nargs="+", type=int, default=[16, 256, 4096, 16384])
    parser.add_argument("--offset", type=float, default=0.5)
    args = parser.parse_args(argv)
    print(f"{'mechanism':12s}" + "".join(f"{'N=' + str(n):>12s}" for n in args.seq_lens))
    for name in args.mechanisms:
        torch.manual_seed(0)
        attn = build_attention(name, dim=64, num_heads=4).eval()
        cells = []
        for n in args.seq_lens:
            x = torch.randn(1, n, 64) + args.offset
            with torch.no_grad():
                q, k, v = attn.split_heads(attn.qkv(x))
                cells.append(attn.attend(q, k, v, None).pow(2).mean().sqrt().item())
        print(f"{name:12s}" + "".join(f"{c:12.1e}" for c in cells))


if __name__ == "__main__":
    main()
