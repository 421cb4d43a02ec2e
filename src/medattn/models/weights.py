"""Weight files: reading any of them (:func:`read_state_dict`) and loading one strictly (:func:`load_strictly`).

Every weight file medattn reads goes through :func:`read_state_dict`: ``.safetensors``, or a PyTorch file read with
``torch.load(weights_only=True)`` (no code runs; anything but tensors and plain containers is refused), unwrapped
from a training checkpoint's container. A model that must match its file exactly (the tile encoders of
:mod:`medattn.slides`, timm models) loads it with :func:`load_strictly`, which returns a report; the pretrained ViT
weights that are adapted to another model go through :func:`medattn.models.pretrained.load_pretrained`.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from medattn.errors import UserError

CONTAINERS = ("state_dict", "model", "teacher", "student")  # where training checkpoints keep the weights


def read_state_dict(source) -> dict[str, torch.Tensor]:
    """Name -> tensor from a safetensors file, a ``torch.load(weights_only=True)`` file or a dict,
    unwrapped from a training checkpoint's container (:data:`CONTAINERS`)."""
    if isinstance(source, dict):
        data, where = source, "the state dict"
    else:
        path, where = Path(source), str(source)
        if not path.is_file():
            raise UserError(f"{path}: no such weights file")
        data = _read_file(path)
    for _ in range(2):  # e.g. {"model": {...}} or {"teacher": {...}}
        if not isinstance(data, dict) or all(isinstance(v, torch.Tensor) for v in data.values()):
            break
        inner = [data[k] for k in CONTAINERS if isinstance(data.get(k), dict)]
        data = inner[0] if inner else data
    if not isinstance(data, dict) or not data or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise UserError(f"{where}: holds no state dict (a mapping of names to tensors, possibly under "
                        f"{', '.join(CONTAINERS)})")
    return dict(data)


def _read_file(path: Path):
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(path)
        except Exception as error:  # safetensors raises its own error types for corrupt files
            raise UserError(f"{path}: unreadable safetensors file ({error})") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:  # torch's message is many lines; keep the unpickler's reason
        if "Unsupported global" not in str(error):  # not a pickle, or a corrupt one
            reason = [line.strip() for line in str(error).splitlines() if "Unsupported" in line or "invalid" in line]
            raise UserError(f"{path}: unreadable PyTorch weights file ({(reason or ['not a pickle'])[0]})") from None
        raise UserError(f"{path}: not a plain weights file (torch.load with weights_only=True refused it: it holds "
                        f"objects other than tensors and plain containers; save a state dict or safetensors)") from None
    except Exception as error:  # a corrupt or foreign file
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"{path}: unreadable PyTorch weights file ({first})") from None


def load_strictly(model: torch.nn.Module, state: dict[str, torch.Tensor], where, layout: str,
                  drop: tuple[str, ...] = ()) -> dict:
    """Load ``state`` into ``model`` exactly: DDP's ``module.`` prefix removed, the tensors whose names start with one
    of ``drop`` (a classifier the model does not have) dropped; then every tensor of the model must be there with its
    shape, and nothing else. Nothing is written to the model before every tensor has been checked.

    UserError: ``"{where}: {layout} (N missing, e.g. [...]; M unexpected, e.g. [...]; K of another shape, e.g. NAME
    has shape (...), the model's (...))"``. Returns the report: ``loaded`` (the model's names, all of them) and
    ``dropped`` (the file's names left out)."""
    state = {key.removeprefix("module."): value for key, value in state.items()}
    own = model.state_dict()
    dropped = sorted(key for key in state if key not in own and key.startswith(drop))
    state = {key: value for key, value in state.items() if key not in dropped}
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    wrong = sorted(key for key in set(own) & set(state) if own[key].shape != state[key].shape)
    if missing or unexpected or wrong:
        example = (f", e.g. {wrong[0]} has shape {tuple(state[wrong[0]].shape)}, the model's "
                   f"{tuple(own[wrong[0]].shape)}" if wrong else "")
        raise UserError(f"{where}: {layout} ({len(missing)} missing, e.g. {missing[:3]}; {len(unexpected)} unexpected, "
                        f"e.g. {unexpected[:3]}; {len(wrong)} of another shape{example})")
    model.load_state_dict(state, strict=True)
    return {"loaded": list(own), "dropped": dropped}
