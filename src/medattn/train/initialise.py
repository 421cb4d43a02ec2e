"""``--init-from``: a new model started from another run's checkpoint or a plain weights file (supervised runs).

A checkpoint must fill the new model's encoder (every tensor outside its ``head``): it is refused when a tensor of
the encoder has another shape there (another preset: ``vit2d_small``'s pretraining into ``vit2d_tiny``) or when no
tensor outside the head shares a name and shape (a ViT's pretraining into a ResNet, where only the head's bias
matched). Tensors only one attention mechanism has (SeqNorm's norms) stay new, as :func:`convert_attention` keeps
them; the head is the task's and may differ. So a run records ``pretrained`` only when its encoder was loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from medattn.errors import UserError
from medattn.models.pretrained import describe, load_pretrained
from medattn.runtime import checkpoint

#: Tensor names a log line shows before it counts the rest.
SHOWN_NAMES = 6
#: The prefix of the task's own tensors (the classifier head), which a checkpoint need not fill.
HEAD = "head."


def initialise(model: nn.Module, init_from: str | Path, log: Callable[[str], None]) -> dict:
    """Load ``init_from`` into a new model: a plain weights file (timm, DINO, MAE or MONAI ViT) or another run's
    checkpoint (its shared tensors, which must fill the encoder: :func:`encoder_problem`); logs and returns what was
    loaded, adapted, new and unused."""
    if checkpoint.is_plain_weights(init_from):
        loaded = load_pretrained(model, init_from)
        log(f"initialised from {init_from}: {describe(loaded)}")
        return {"from": str(init_from), **loaded}
    folder = checkpoint.resolve(init_from)
    meta = checkpoint.load_meta(folder)
    problem = encoder_problem(model, folder)
    if problem:
        raise UserError(f"--init-from {init_from} ({meta['config']['model']['name']}): {problem}; start from a "
                        f"checkpoint of the same preset")
    new, unused = checkpoint.init_from(model, folder)
    pretrained = meta.get("pretrained")  # written by medattn pretrain
    log(f"initialised from {init_from}" + (f" (pretrained by {pretrained['objective']})" if pretrained else "")
        + f": {len(new)} new tensor(s)" + (f": {_some(new)}" if new else "")
        + (f"; {len(unused)} checkpoint tensor(s) unused: {_some(unused)}" if unused else "")
        + ("; every name is in results.json (init_from)" if len(new) + len(unused) > 2 * SHOWN_NAMES else ""))
    return {"from": str(init_from), "new_tensors": new, "unused_tensors": unused, "pretrained": pretrained}


def encoder_problem(model: nn.Module, folder: Path) -> str | None:
    """Why the checkpoint in ``folder`` would load less than ``model``'s encoder (its tensors outside :data:`HEAD`),
    or None when it fills it (see the module docstring). ``model`` may be on the meta device."""
    stored = checkpoint.header_shapes(folder)
    own = {name: tuple(t.shape) for name, t in model.state_dict().items() if not name.startswith(HEAD)}
    other = [name for name, shape in own.items() if name in stored and stored[name] != shape]
    if other:
        return (f"it would load less than the encoder: {len(other)} of the model's encoder tensors have another "
                f"shape in it ({other[0]}: {list(stored[other[0]])} there, {list(own[other[0]])} in the model)")
    if not any(stored.get(name) == shape for name, shape in own.items()):
        return "it would load none of the encoder: no tensor outside the head shares a name and shape with the model"
    return None


def takes_encoder(model_config: dict, init_from: str | Path) -> bool:
    """Whether a model of ``model_config`` (a config's ``model`` section) takes the encoder of the checkpoint at
    ``init_from`` (a plain weights file: yes, its loader adapts it); the model is built on the meta device."""
    if checkpoint.is_plain_weights(init_from):
        return True
    from medattn.runtime.build import build_model

    folder = checkpoint.resolve(init_from)
    task = checkpoint.task_from_dict(checkpoint.load_meta(folder)["task"])
    with torch.device("meta"):
        model = build_model(model_config, task)
    return encoder_problem(model, folder) is None


def _some(names: list[str]) -> str:
    """The first :data:`SHOWN_NAMES` names, and how many more."""
    more = len(names) - SHOWN_NAMES
    return ", ".join(names[:SHOWN_NAMES]) + (f" and {more} more" if more > 0 else "")
