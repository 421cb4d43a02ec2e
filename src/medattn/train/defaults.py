"""Training settings that default per model, resolved once and recorded.

``train.optimizer``, ``train.lr``, ``train.weight_decay``, ``train.warmup_epochs``, ``train.schedule`` and
``train.grad_clip`` are ``null`` in :data:`medattn.config.DEFAULTS`: "the model's own" (``grad_clip: 0``
switches clipping off). A value the user sets (YAML or ``key=value``) always wins;
a null takes the preset's entry in :data:`medattn.models.presets.TRAINING`, else :data:`GENERAL`. The
resolved values are what the run saves in config.yaml and the checkpoint, and the summary and results.json
name the ones a default chose (``defaults``), so a reader never has to infer them from tensor names.

Why per model: gated attention-MIL is trained by CLAM with Adam, lr 2e-4, weight decay 1e-5, a constant rate
and no gradient clipping; under the transformers' AdamW (weight decay 0.05, cosine decay, gradient norm clipped
at 1) its train loss rose above the label prior's on the realistic IHC bags, and with Adam but the clipping
it still did (docs/realistic.md).
"""

from __future__ import annotations

import copy

#: Settings of every model without an entry of its own (AdamW as ViTs train; 1e-4 is the paper's rate).
GENERAL = {"optimizer": "adamw", "lr": 1e-4, "weight_decay": 0.05, "warmup_epochs": 1.0, "schedule": "cosine",
           "grad_clip": 1.0}
AUTO_KEYS = tuple(GENERAL)


def training_defaults(model_name: str) -> dict:
    """The values :data:`AUTO_KEYS` take for preset ``model_name`` when the config leaves them null."""
    from medattn.models.presets import TRAINING

    return {**GENERAL, **TRAINING.get(model_name, {})}


def resolve_training(config: dict) -> tuple[dict, dict]:
    """-> (a copy of ``config`` with every null :data:`AUTO_KEYS` filled for its model, the filled values as
    ``{"train.lr": value, ...}``). A config resolved already comes back unchanged, with nothing filled."""
    resolved = copy.deepcopy(config)
    defaults = training_defaults(config["model"]["name"])
    chosen = {}
    for key in AUTO_KEYS:
        if resolved["train"].get(key) is None:
            resolved["train"][key] = defaults[key]
            chosen[f"train.{key}"] = defaults[key]
    return resolved, chosen
