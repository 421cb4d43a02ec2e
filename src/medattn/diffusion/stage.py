"""What the two diffusion stages share as training tasks of the training loop (:mod:`medattn.train.training_tasks`).

Both train on the unlabelled volumes of a registered kind (:func:`medattn.diffusion.data.volume_bundle`), in fp32,
in one process, without gradient accumulation (:func:`check_diffusion_run`). Their batch order and the absorbing
masks come from one ``torch.Generator`` seeded with ``seed`` (kept in ``checkpoints/last``, so ``--resume``
continues the same sequence); a step weighs one in the epoch's mean training loss. Their checkpoints are
:mod:`medattn.diffusion.model`'s (``config`` and ``diffusion``: stage, volume shape, SYNTHETIC flag, epoch);
results.json holds the task, the SYNTHETIC flag, the volume shape, the best epoch and the test figures, and the
summary (:func:`diffusion_summary`) is boxed as a supervised run's. The best epoch has the lowest validation score
(stage 1: L1, stage 2: loss).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from medattn.config import validate
from medattn.data import DataBundle
from medattn.diffusion.data import KINDS, volume_shape
from medattn.diffusion.model import check_stage_config, read_meta
from medattn.errors import UserError
from medattn.outputs import OutputFolder
from medattn.runtime import distributed
from medattn.runtime.device import check_device
from medattn.train.training_tasks import Planned
from medattn.vocabulary.task_types import task_type


def check_diffusion_run(config: dict, init_from: str | Path | None = None) -> None:
    """Everything cheap about a diffusion config: the schema, the stage, the device, unsupported options."""
    validate(config)
    check_stage_config(config)
    check_device(config["train"]["device"])
    if init_from:
        raise UserError("--init-from is not supported by the diffusion stages (stage 2 takes its VQ-AE from "
                        "diffusion.vqae_checkpoint; --resume continues a stopped run)")
    if config["train"]["epochs"] is None:
        raise UserError("the diffusion stages need train.epochs (the packaged configs state the papers' budgets)")
    if config["train"]["precision"] != "fp32":
        raise UserError("train.precision: the diffusion stages train in fp32 only")
    if config["train"]["grad_accum"] != 1:
        raise UserError("train.grad_accum: the diffusion stages take no gradient accumulation (set 1)")
    if config["diffusion"]["perceptual_weight"] > 0 and not config["diffusion"]["perceptual_net"]:
        raise UserError("diffusion.perceptual_weight > 0 needs diffusion.perceptual_net (a local .pt2 file)")
    if distributed.world_size() > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError("the diffusion stages run in one process (no torchrun)")


def volume(dataset, index: int) -> torch.Tensor:
    """(1, 1, H, W, D) float32 of one sample."""
    return dataset[index]["input"][None].float()


class DiffusionStage:
    """The hooks both stages answer alike (:class:`medattn.train.training_tasks.TrainingTask`); a stage adds ``fields``,
    ``build``, ``batches``, ``batch_loss``, ``validate`` and ``test``."""

    higher_is_better = False  # the lowest validation L1 (stage 1) or loss (stage 2) is best

    def __init__(self, bundle: DataBundle, log: Callable[[str], None]) -> None:
        self.bundle, self.log = bundle, log
        self.stage1_config: dict | None = None  # stage 2: the VQ-AE's config, recorded in its checkpoints

    def check(self, config: dict, init_from: str | Path | None, progress: bool) -> None:
        check_diffusion_run(config, init_from)
        kind = config["data"].get("kind")
        if kind not in KINDS or task_type(self.bundle.task.task_type).labelled:
            raise UserError(f"data.kind: the diffusion tasks read {', '.join(KINDS)}, got {kind!r}")
        if min(len(self.bundle.train), len(self.bundle.val), len(self.bundle.test)) == 0:
            raise UserError("data: the diffusion stages need training volumes and at least one validation and one "
                            "test volume")

    def plan(self, config: dict, chosen: dict) -> Planned:
        return Planned(config)  # the config as given: no data plan, and config.yaml lists no defaults

    def saved_meta(self, folder: Path) -> dict:
        return read_meta(folder)

    def start(self, config: dict, device: torch.device) -> None:
        """Keep the planned config and the device; the generator of the batch order (and stage 2's masks)."""
        self.config, self.device, self.diff_cfg = config, device, config["diffusion"]
        self.generator = torch.Generator().manual_seed(config["seed"])

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"stage.generator": self.generator.get_state()}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        if "stage.generator" not in tensors:
            raise UserError("--resume: checkpoints/last holds no batch-order state (written before the diffusion "
                            "stages could resume): start the run again with --overwrite")
        self.generator.set_state(tensors["stage.generator"])

    def meta(self, epoch: int) -> dict:
        """The checkpoint metadata of ``epoch`` (:func:`medattn.diffusion.model.read_meta` reads it)."""
        extra = {} if self.stage1_config is None else {"vqae_config": self.stage1_config}
        return {"config": self.config, "diffusion": {"stage": self.config["task"],
                                                     "volume_shape": list(volume_shape(self.bundle)),
                                                     "synthetic": self.bundle.task.synthetic, "epoch": epoch, **extra}}

    def results(self, run_dir: Path, state: dict, train_seconds: float) -> dict:
        return {"task": self.config["task"], "synthetic": self.bundle.task.synthetic,
                "volume_shape": list(volume_shape(self.bundle)), "best_epoch": state["best_epoch"]}

    def finish(self, run_dir: Path, results: dict) -> dict:
        """results.json and the summary."""
        OutputFolder.within(run_dir).save_json("results.json", results)
        self.log(diffusion_summary(results, run_dir))
        return results


def diffusion_summary(results: dict, run_dir: Path) -> str:
    """The boxed summary of a diffusion stage, as a supervised run prints it: run, task, best epoch and every
    test figure on its own line (nested figures, such as diffusion vs random per metric, flattened)."""
    def lines(values: dict, prefix: str = "") -> list[str]:
        out = []
        for key, value in values.items():
            if isinstance(value, dict):
                out += lines(value, f"{prefix}{key} ")
            else:
                shown = f"{value:.4f}" if isinstance(value, float) else str(value)
                out.append(f"test {prefix}{key}".ljust(15) + f"{shown}")
        return out

    tag = "  [SYNTHETIC data]" if results["synthetic"] else ""
    return "\n".join(["=" * 72, f"run            {run_dir}{tag}", f"task           {results['task']}",
                      f"volume shape   {'x'.join(map(str, results['volume_shape']))}",
                      f"best epoch     {results.get('best_epoch')}", *lines(results["test"]),
                      *(f"WARNING        {w}" for w in results.get("warnings", [])),
                      "files          config.yaml metrics.csv checkpoints/best results.json", "=" * 72])
