"""train.optimizer and train.schedule: Adam, linear ramp-up and step decay (BinaryFormer App. A.1), constant."""

import pytest
import torch

from medattn.config import DEFAULTS, load_config
from medattn.errors import UserError
from medattn.train.defaults import GENERAL
from medattn.train.optim import lr_at, make_optimizer, scheduled_lr


def cfg(**kw):
    return {**DEFAULTS["train"], **GENERAL, "lr": 1.0, "min_lr": 0.0, **kw}


def test_step_schedule_ramps_up_then_divides_at_the_milestones():
    train = cfg(schedule="step", step_milestones=[0.5, 0.75], step_gamma=0.1)
    lrs = [scheduled_lr(s, 100, 10, train) for s in range(100)]
    assert lrs[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])  # linear ramp-up
    assert lrs[10:50] == pytest.approx([1.0] * 40)
    assert lrs[50:75] == pytest.approx([0.1] * 25) and lrs[75:] == pytest.approx([0.01] * 25)


def test_constant_and_cosine_schedules():
    assert [scheduled_lr(s, 10, 2, cfg(schedule="constant")) for s in range(10)] == pytest.approx([0.5] + [1.0] * 9)
    cosine = cfg(schedule="cosine", min_lr=0.1)
    assert [scheduled_lr(s, 10, 2, cosine) for s in range(11)] == [lr_at(s, 10, 2, 1.0, 0.1) for s in range(11)]


def test_optimizer_choice_and_config_keys():
    model = torch.nn.Linear(3, 2)
    assert type(make_optimizer(model, cfg(optimizer="adam"))) is torch.optim.Adam
    assert type(make_optimizer(model, cfg())) is torch.optim.AdamW
    config = load_config(None, ["data.kind=x", "train.optimizer=adam", "train.schedule=step",
                                "train.step_milestones=[0.6, 0.9]", "train.step_gamma=0.5"])
    assert config["train"]["step_milestones"] == [0.6, 0.9]
    for bad in ("train.optimizer=sgd", "train.schedule=linear", "train.step_milestones=[0.9, 0.5]",
                "train.step_milestones=[0, 0.5]", "train.step_gamma=0"):
        with pytest.raises(UserError, match=bad.split("=")[0]):
            load_config(None, ["data.kind=x", bad])
