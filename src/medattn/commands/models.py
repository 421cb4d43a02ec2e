"""List the model presets, attention mechanisms, data kinds and packaged configs."""

from __future__ import annotations

import argparse

SHOWN = ("img_size", "patch_size", "in_chans", "feature_dim", "embed_dim", "attn_dim", "depth", "num_heads",
         "mlp_dim")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", action="store_true", help="list only the packaged configs")


def run(args: argparse.Namespace) -> int:
    from medattn.attention import available_attentions
    from medattn.config import packaged_configs
    from medattn.data import available_data_kinds
    from medattn.diffusion.data import KINDS
    from medattn.diffusion.model import STAGES
    from medattn.models.presets import PRESETS

    if args.configs:
        print("\n".join(packaged_configs()))
        return 0
    print("model presets (create_model name; any keyword overrides):")
    for name in sorted(PRESETS):
        cls, preset = PRESETS[name]
        values = "  ".join(f"{k}={preset[k]}" for k in SHOWN if k in preset)
        print(f"  {name:<14} {cls.__name__:<18} {values}")
    print(f"attention mechanisms: {', '.join(available_attentions())}")
    print(f"data kinds: {', '.join(available_data_kinds())}")
    print(f"diffusion (task: {', '.join(STAGES)}; docs/diffusion.md): models "
          f"{', '.join(f'{model} ({task})' for task, model in STAGES.items())}, data kinds {', '.join(KINDS)}")
    print(f"packaged configs: {', '.join(packaged_configs())}")
    return 0
