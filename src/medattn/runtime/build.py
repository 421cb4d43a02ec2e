"""From a config's model section to a model: checks that build nothing, and the build."""

from __future__ import annotations

import inspect

from torch import nn

from medattn.attention import available_attentions
from medattn.data import input_kinds
from medattn.data.base import TaskInfo
from medattn.errors import UserError
from medattn.models import create_model, input_contract, takes_attention
from medattn.models.presets import PRESETS


def accepted_kwargs(name: str) -> set[str] | None:
    """The keyword arguments preset ``name``'s class takes (``attention`` aside); None when it takes any."""
    parameters = inspect.signature(PRESETS[name][0]).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return {k for k in parameters if k not in ("self", "attention")}


def check_model_config(model_cfg: dict) -> None:
    """The model section names a preset, a registered mechanism (or none, for models without one) and
    only keyword arguments the preset's class takes; a UserError names the key. Cheap: builds nothing."""
    name, attention, kwargs = model_cfg["name"], model_cfg.get("attention"), model_cfg.get("kwargs") or {}
    if name not in PRESETS:
        raise UserError(f"model.name: unknown model {name!r}; available: {', '.join(sorted(PRESETS))}")
    if attention is not None:
        if not takes_attention(name):
            raise UserError(f"model.attention: model {name!r} has no attention mechanism; got {attention!r} "
                            f"(set model.attention=null)")
        if attention not in available_attentions():
            raise UserError(f"model.attention: unknown attention {attention!r}; available: "
                            f"{', '.join(available_attentions())}")
    accepted = accepted_kwargs(name)
    unknown = [] if accepted is None else [k for k in kwargs if k not in accepted]
    if unknown:
        raise UserError(f"model.kwargs.{unknown[0]}: model {name!r} takes no argument {unknown[0]!r}; "
                        f"it takes {', '.join(sorted(accepted))}")


def build_model(model_cfg: dict, task: TaskInfo) -> nn.Module:
    """The configured preset with its input and output sizes taken from the task (explicit kwargs win).

    Built on the current default device (``with torch.device("meta")`` builds shapes only). Values the
    model refuses (``ValueError``/``TypeError`` from its constructor) become a UserError naming
    ``model.kwargs`` and the sizes taken from the data.
    """
    check_model_config(model_cfg)
    name = model_cfg["name"]
    given = dict(model_cfg.get("kwargs") or {})
    kwargs = {**given}
    kwargs.setdefault("num_classes", task.num_outputs)
    kind, contract = input_kinds.of(task.input_kind), input_contract(name)
    if contract != kind.contract:
        wants = " or ".join(k.noun for k in input_kinds.taken_by(contract))
        raise UserError(f"model {name!r} takes {wants} but the data gives {task.input_kind} inputs")
    takes = inspect.signature(PRESETS[name][0]).parameters
    for key, value in kind.model_sizes(task.input_shape).items():  # in_chans (img_size) or feature_dim
        if key != "img_size" or key in takes:  # the model's grid is the data's grid, where it takes one
            kwargs.setdefault(key, value)
    try:
        return create_model(name, attention=model_cfg.get("attention"), **kwargs)
    except (ValueError, TypeError) as error:
        from_data = {k: v for k, v in kwargs.items() if k not in given}
        raise UserError(f"model.kwargs {given or '{}'} (with {from_data} from the data) do not build model "
                        f"{name!r}: {error}") from error
