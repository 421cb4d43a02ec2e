"""List the model presets, tile encoders, attention mechanisms, data kinds and packaged configs.

Read from :mod:`medattn.catalogue` without importing torch, so the list answers in a fraction of a second."""

from __future__ import annotations

import argparse

SHOWN = ("img_size", "patch_size", "in_chans", "feature_dim", "embed_dim", "attn_dim", "depth", "num_heads",
         "mlp_dim", "stem", "global_pool", "readout")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", action="store_true", help="list only the packaged configs")


def run(args: argparse.Namespace) -> int:
    from medattn.catalogue import ATTENTIONS, DATA_KINDS, DIFFUSION_STAGES, PRESETS, UNLABELLED_KINDS
    from medattn.config import packaged_configs
    from medattn.slides.encoders import ENCODERS, extractor_kinds

    if args.configs:
        print("\n".join(packaged_configs()))
        return 0
    print("model presets (create_model name; any keyword overrides):")
    name_width = max(map(len, PRESETS)) + 1
    class_width = max(len(model_class) for model_class, _ in PRESETS.values()) + 1
    for name in sorted(PRESETS):
        model_class, preset = PRESETS[name]
        values = "  ".join(f"{k}={preset[k]}" for k in SHOWN if k in preset)
        print(f"  {name:<{name_width}} {model_class:<{class_width}} {values}".rstrip())
    print("tile encoders (wsi extract --extractor NAME:FILE; docs/slides.md):")
    encoder_width = max(map(len, extractor_kinds())) + 1
    for name in extractor_kinds():
        card = ENCODERS[name]
        width = "the file's" if card.features is None else card.features
        print(f"  {name:<{encoder_width}} {card.about}; {width} features per tile")
    print(f"attention mechanisms: {', '.join(sorted(ATTENTIONS))}")
    print(f"data kinds: {', '.join(sorted(DATA_KINDS))}")
    models = ", ".join(f"{model} ({task})" for task, model in DIFFUSION_STAGES.items())
    print(f"diffusion (task: {', '.join(DIFFUSION_STAGES)}; docs/diffusion.md): models {models}, "
          f"data kinds {', '.join(UNLABELLED_KINDS)}")
    print(f"packaged configs: {', '.join(packaged_configs())}")
    return 0
