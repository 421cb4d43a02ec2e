"""``--init-from``: a new model started from another run's checkpoint or a plain weights file (supervised runs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

from medattn.models.pretrained import describe, load_pretrained
from medattn.runtime import checkpoint

#: Tensor names a log line shows before it counts the rest.
SHOWN_NAMES = 6


def initialise(model: nn.Module, init_from: str | Path, log: Callable[[str], None]) -> dict:
    """Load ``init_from`` into a new model: a plain weights file (timm, DINO, MAE or MONAI ViT) or another run's
    checkpoint (its shared tensors); logs and returns what was loaded, adapted, new and unused."""
    if checkpoint.is_plain_weights(init_from):
        loaded = load_pretrained(model, init_from)
        log(f"initialised from {init_from}: {describe(loaded)}")
        return {"from": str(init_from), **loaded}
    folder = checkpoint.resolve(init_from)
    new, unused = checkpoint.init_from(model, folder)
    pretrained = checkpoint.load_meta(folder).get("pretrained")  # written by medattn pretrain
    log(f"initialised from {init_from}" + (f" (pretrained by {pretrained['objective']})" if pretrained else "")
        + f": {len(new)} new tensor(s)" + (f": {_some(new)}" if new else "")
        + (f"; {len(unused)} checkpoint tensor(s) unused: {_some(unused)}" if unused else "")
        + ("; every name is in results.json (init_from)" if len(new) + len(unused) > 2 * SHOWN_NAMES else ""))
    return {"from": str(init_from), "new_tensors": new, "unused_tensors": unused, "pretrained": pretrained}


def _some(names: list[str]) -> str:
    """The first :data:`SHOWN_NAMES` names, and how many more."""
    more = len(names) - SHOWN_NAMES
    return ", ".join(names[:SHOWN_NAMES]) + (f" and {more} more" if more > 0 else "")
