"""The pretraining run: ``medattn pretrain CONFIG`` trains the config's model by its objective (:mod:`.objectives`:
a ViT preset as a masked autoencoder on unlabelled images or volumes, the bag transformer on two views of each
unlabelled bag), resumable, and leaves a checkpoint that ``medattn train --init-from`` (and
``medattn compare --init-from``) starts from.

Run folder::

    config.yaml                  the resolved config (``pretrain.*`` included)
    metrics.csv                  epoch, lr, the objective's loss, seconds
    pretrain.json                what was pretrained on (cases, pool, input shape), the settings, the time
    checkpoints/last/            the objective's wrapper (model + decoder or projection), optimizer and RNG state:
                                 ``--resume``
    checkpoints/best/            the model alone (the decoder or projection dropped): what ``--init-from`` reads

The order of each epoch's batches comes from a generator seeded with ``seed`` and the epoch, and the masks from
one seeded with ``seed`` and the step, so a resumed run continues with the batches and masks it would have had. A run
killed inside its first checkpoint writes (``best`` written and ``last`` not, or no checkpoint at all) is pretrained
again from epoch 1 by ``--resume``, if its config is the one it saved (``best``'s, else config.yaml).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from medattn.config import config_yaml, validate
from medattn.data.base import DataBundle
from medattn.errors import UserError
from medattn.outputs import OutputFolder
from medattn.runtime import checkpoint
from medattn.runtime.build import build_model, check_model_config
from medattn.runtime.device import open_device
from medattn.text import bars_off
from medattn.threads import set_threads
from medattn.train.model_setup import fit_feature_norm, preset_design
from medattn.train.optim import lr_at, param_groups
from medattn.train.rundir import config_diff, killed_run_config, run_folder
from medattn.train.sampling import seed_everything

from .data import pretraining_set
from .objectives import OBJECTIVES, Objective, objective_for

MIN_LR = 1e-6
METRICS = ("epoch", "lr", "loss", "seconds")  # the columns of metrics.csv
BETAS = (0.9, 0.95)  # MAE's


def epoch_loader(dataset: Dataset, batch_size: int, seed: int, epoch: int, objective: Objective) -> DataLoader:
    """The epoch's batches (``objective``'s inputs) in an order fixed by ``seed`` and ``epoch``; the last partial
    batch is dropped unless it is the only one (MAE's habit: every step the same size)."""
    order = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    drop_last = len(dataset) > batch_size
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=order, collate_fn=objective.inputs,
                      drop_last=drop_last)


def build_objective(config: dict, bundle: DataBundle) -> tuple[Objective, nn.Module]:
    """The config's model (any mechanism) inside the wrapper of its objective (:mod:`.objectives`) with
    ``pretrain.*``; a one-line UserError for a model no objective pretrains or settings it refuses."""
    check_model_config(config["model"])
    model = build_model(config["model"], bundle.task)
    objective = objective_for(model)
    if objective is None:
        offered = "; ".join(f"{o.name} pretrains {o.model_type.__name__}" for o in OBJECTIVES)
        raise UserError(f"medattn pretrain: no objective pretrains model {config['model']['name']!r} "
                        f"({type(model).__name__}): {offered} (the presets vit2d*, vit3d*; the bag presets vitwsi*)")
    p = config["pretrain"]
    if p["batch_size"] < objective.min_batch:
        raise UserError(f"pretrain.batch_size: {objective.name} needs at least {objective.min_batch} samples a step, "
                        f"got {p['batch_size']}")
    try:
        return objective, objective.wrap(model, p)
    except ValueError as error:
        raise UserError(f"pretrain: {error}") from None


def one_epoch(wrapper: nn.Module, optimizer: torch.optim.Optimizer, batches, state: dict,
              schedule: Callable[[int], float], seed: int, device: torch.device) -> tuple[float, float]:
    """One pass over ``batches``; ``state["step"]`` counts optimizer steps, sets the rate (``schedule(step)``) and
    seeds the step's masks or views. -> (mean loss, the last rate); a UserError if the loss stops being finite."""
    wrapper.train()
    losses, lr = [], None
    for inputs in batches:
        lr = schedule(state["step"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        draws = torch.Generator().manual_seed(seed * 1_000_003 + state["step"])  # the step's masks or views
        loss = wrapper(*(None if x is None else x.to(device) for x in inputs), generator=draws)[0]
        value = loss.item()
        if not math.isfinite(value):
            raise UserError(f"pretraining diverged at step {state['step']} (loss {value}); lower pretrain.lr")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        state["step"] += 1
        losses.append(value)
    return sum(losses) / len(losses), lr


def pretrain(config: dict, bundle: DataBundle, run_dir: str | Path, *, resume: bool = False,
             overwrite: bool = False, progress: bool = True, log: Callable[[str], None] = print,
             on_epoch_end: Callable[[int, dict], None] | None = None) -> dict:
    """Pretrain ``config``'s model on ``bundle``'s training split (labels unused) and ``pretrain.pool``; -> the
    summary written to pretrain.json. ``on_epoch_end(epoch, row)`` runs after each epoch's checkpoints (tests
    interrupt a run with it)."""
    validate(config)
    run_dir = Path(run_dir)
    p, seed = config["pretrain"], config["seed"]
    device = open_device(config["train"]["device"])
    killed = killed_run_config(run_dir, lambda best: checkpoint.load_meta(best)["config"]) if resume else None
    if killed is not None:  # killed inside its first checkpoint writes: pretrained again from epoch 1
        if config_diff(killed, config):
            raise UserError("--resume: the config differs from the pretraining run's saved config")
        log(f"{run_dir} stopped before its first resumable checkpoint: pretraining it again from epoch 1")
        resume, overwrite = False, True
    with run_folder(run_dir, resume, overwrite):
        run = OutputFolder.within(run_dir)  # the run folder's policy: train.rundir's transaction
        set_threads(config["train"]["threads"], log)
        seed_everything(seed)
        dataset, described = pretraining_set(bundle, config["data"], p["pool"])
        objective, wrapper = build_objective(config, bundle)
        if len(dataset) < objective.min_batch:
            raise UserError(f"medattn pretrain: {objective.name} needs at least {objective.min_batch} unlabelled "
                            f"inputs, got {len(dataset)}")
        standardised = fit_feature_norm(wrapper.encoder, dataset)  # bags: the pretraining set's statistics
        wrapper = wrapper.to(device)
        optimizer = torch.optim.AdamW(param_groups(wrapper, p["weight_decay"]), lr=p["lr"], betas=BETAS)
        steps_per_epoch = len(epoch_loader(dataset, p["batch_size"], seed, 1, objective))
        total, warmup = p["epochs"] * steps_per_epoch, round(p["warmup_epochs"] * steps_per_epoch)
        state = {"epoch": 0, "step": 0, "seconds": 0.0}
        meta = {"config": config, "task": checkpoint.task_to_dict(bundle.task),
                "model_defaults": preset_design(config["model"]),
                "pretrained": {"objective": objective.name, **described}}
        if resume:
            last = checkpoint.resolve(run_dir / "checkpoints" / "last")
            if checkpoint.load_meta(last)["config"] != config:
                raise UserError("--resume: the config differs from the pretraining run's saved config")
            checkpoint.load_model(last, wrapper)
            state.update({k: v for k, v in checkpoint.load_training_state(last, optimizer).items() if k in state})
            log(f"resuming {run_dir} after epoch {state['epoch']} (step {state['step']})")
            kept = (run_dir / "metrics.csv").read_text().splitlines()[: 1 + state["epoch"]]  # rows after it: lost
            run.save_text("metrics.csv", "\n".join(kept) + "\n")
        else:
            run.save_text("config.yaml", config_yaml(config))
            run.save_csv("metrics.csv", METRICS, [])
        chance = wrapper.chance_loss(min(p["batch_size"], len(dataset)))  # the loss of learning nothing, or None
        log(f"pretraining {config['model']['name']} ({config['model']['attention']}) {objective.describe(p)} on "
            f"{len(dataset)} unlabelled inputs ({described['train_cases']} training cases, {described['pool_cases']} "
            f"from the pool), {p['epochs']} epochs of {steps_per_epoch} steps"
            + (f"; an encoder that learned nothing scores {chance:.4f}" if chance is not None else ""))
        if described.get("pool_held_out"):
            log(f"pretrain.pool: {described['pool_held_out']} file(s) left out: the config's validation or test split "
                f"holds them, and those are never pretrained on")
        last_loss = None
        for epoch in range(state["epoch"] + 1, p["epochs"] + 1):
            started = time.time()
            batches = tqdm(epoch_loader(dataset, p["batch_size"], seed, epoch, objective),
                           desc=f"pretrain epoch {epoch}", leave=False, disable=not progress or bars_off())
            last_loss, lr = one_epoch(wrapper, optimizer, batches, state,
                                      lambda step: lr_at(step, total, warmup, p["lr"], MIN_LR), seed, device)
            seconds = time.time() - started
            state["epoch"], state["seconds"] = epoch, state["seconds"] + seconds
            row = {"epoch": epoch, "lr": lr, "loss": last_loss, "seconds": seconds}
            epoch_meta = {**meta, "epoch": epoch}
            checkpoint.save(run_dir / "checkpoints" / "best", wrapper.encoder, epoch_meta)
            checkpoint.save(run_dir / "checkpoints" / "last", wrapper, epoch_meta, optimizer, state)
            run.append_csv("metrics.csv", [{"epoch": epoch, "lr": f"{lr:.6g}", "loss": f"{last_loss:.6f}",
                                            "seconds": f"{seconds:.2f}"}], METRICS)
            versus = f", chance {chance:.4f}" if chance is not None else ""
            log(f"pretrain epoch {epoch}/{p['epochs']}: {objective.name} loss {last_loss:.4f}{versus} "
                f"({seconds:.1f} s)")
            if on_epoch_end is not None:
                on_epoch_end(epoch, row)
        summary = {"run_dir": str(run_dir), "model": config["model"]["name"],
                   "attention": config["model"]["attention"], "objective": objective.name,
                   "data": config["data"].get("kind"), "synthetic": bundle.task.synthetic,
                   "input_shape": list(bundle.task.input_shape), **described,
                   **({"feature_norm": standardised} if standardised else {}), "settings": p, "epochs": p["epochs"],
                   "steps": state["step"], "final_loss": last_loss, "chance_loss": chance,
                   "train_seconds": state["seconds"], "threads": torch.get_num_threads(),
                   "checkpoint": str(run_dir / "checkpoints" / "best")}
        run.save_json("pretrain.json", summary)
        log(f"pretrained in {state['seconds'] / 60:.1f} min; start training from it with: medattn train CONFIG "
            f"--init-from {run_dir}")
        return summary
