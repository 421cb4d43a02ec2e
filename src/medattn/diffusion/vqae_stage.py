"""Stage 1 of the 3D VQ diffusion model (``task: diffusion_vqae``), a training task of the training loop.

Every training volume is cut into its p^3 patches; patches of the volumes in a shuffled order are gathered and
shuffled into batches of ``train.batch_size`` patches (:meth:`VQAEStage.batches`); loss
:func:`medattn.diffusion.losses.vqae_loss` (metrics.csv: ``train_loss``, ``train_l1``, ``train_commitment``).
Validation: L1 and PSNR of the reconstructed validation volumes and the codebook usage; the best epoch has the
lowest validation L1. Test: PSNR and SSIM of the reconstructed test volumes by ``checkpoints/best``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import torch

from medattn.diffusion.data import volume_shape
from medattn.diffusion.losses import load_perceptual_net, vqae_loss
from medattn.diffusion.metrics import psnr, ssim
from medattn.diffusion.model import DiffusionModel, build_vqae, load_stage
from medattn.diffusion.stage import DiffusionStage, volume
from medattn.diffusion.vqae import from_patches, patch_grid, to_patches
from medattn.train.training_tasks import Batches, Built, Planned, Validation

FIELDS = ("epoch", "lr", "train_loss", "train_l1", "train_commitment", "val_l1", "val_psnr", "codebook_usage",
          "seconds")


class VQAEStage(DiffusionStage):
    """The VQ-AE on patches (see the module docstring)."""

    fields = FIELDS

    def build(self, planned: Planned, device: torch.device, resumed: dict | None,
              init_from: str | Path | None) -> Built:
        config = planned.config
        self.start(config, device)
        self.vqae = vqae = build_vqae(config).to(device)
        self.perceptual = None
        if self.diff_cfg["perceptual_weight"] > 0:
            self.perceptual = load_perceptual_net(self.diff_cfg["perceptual_net"]).to(device)
        elif self.diff_cfg["gradient_weight"] == 0:
            self.log("perceptual term off (diffusion.perceptual_weight 0): the paper's VGG loss needs ImageNet "
                     "weights, which are not downloaded; set diffusion.perceptual_net (a local .pt2) or "
                     "diffusion.gradient_weight (weight-free) to add one")
        per_volume = math.prod(patch_grid(volume_shape(self.bundle), vqae.patch_size))
        self.steps = math.ceil(len(self.bundle.train) * per_volume / config["train"]["batch_size"])
        return Built(DiffusionModel(vqae), vqae, vqae, self.steps)

    def batches(self, epoch: int) -> Batches:
        return Batches(self.steps, self._patch_batches())

    def _patch_batches(self) -> Iterator[dict]:
        """Patches of the training volumes in a shuffled order, pooled and shuffled, ``train.batch_size`` at a time
        (the last batch of the epoch holds the rest)."""
        dataset, batch, vqae = self.bundle.train, self.config["train"]["batch_size"], self.vqae
        p = vqae.patch_size
        pool = torch.empty(0, vqae.in_chans, p, p, p)
        order = torch.randperm(len(dataset), generator=self.generator).tolist()
        for position, index in enumerate(order):
            pool = torch.cat([pool, to_patches(volume(dataset, index), p)])
            pool = pool[torch.randperm(len(pool), generator=self.generator)]
            last = position == len(order) - 1
            while len(pool) >= batch or (last and len(pool)):
                yield {"input": pool[:batch]}
                pool = pool[batch:]

    def batch_loss(self, model, batch: dict) -> tuple[torch.Tensor, float, dict[str, float]]:
        patches = batch["input"]
        recon, _, commitment = model(patches)
        loss, parts = vqae_loss(recon, patches, commitment, self.perceptual, self.diff_cfg["perceptual_weight"],
                                self.diff_cfg["gradient_weight"])
        return loss, 1, {"l1": parts["l1"], "commitment": parts["commitment"]}

    def validate(self, model: DiffusionModel, epoch: int, progress: bool) -> Validation:
        val = reconstruction_scores(model.vqae, self.bundle.val, self.device, with_ssim=False)
        usage = float(model.vqae.codebook.usage().mean())
        return Validation(val["l1"], val["l1"], {"val_l1": val["l1"], "val_psnr": val["psnr"], "codebook_usage": usage},
                          self.meta(epoch),
                          f"val L1 {val['l1']:.4f}  val PSNR {val['psnr']:.2f} dB  codebook usage {usage:.2f}")

    def test(self, run_dir: Path, results: dict, progress: bool, started: float, case_pictures) -> dict:
        """PSNR and SSIM of the test volumes reconstructed by ``checkpoints/best`` (``case_pictures``: none here)."""
        best, _ = load_stage(run_dir / "checkpoints" / "best")
        test = reconstruction_scores(best.vqae.to(self.device), self.bundle.test, self.device, with_ssim=True)
        return self.finish(run_dir, {**results, "test": test})


@torch.no_grad()
def reconstruction_scores(vqae, dataset, device: torch.device, with_ssim: bool) -> dict:
    """Mean L1, PSNR (and SSIM) of whole volumes passed through the VQ-AE (eval mode)."""
    was_training = vqae.training
    vqae.eval()
    scores: dict[str, list[float]] = {"l1": [], "psnr": [], "ssim": []}
    for index in range(len(dataset)):
        whole = volume(dataset, index)
        grid = patch_grid(tuple(whole.shape[2:]), vqae.patch_size)
        patches = to_patches(whole, vqae.patch_size).to(device)
        recon = from_patches(torch.cat([vqae(chunk)[0] for chunk in patches.split(64)]), grid).cpu()
        scores["l1"].append(float((recon - whole).abs().mean()))
        scores["psnr"].append(psnr(recon.clamp(0, 1), whole))
        if with_ssim:
            scores["ssim"].append(ssim(recon.clamp(0, 1), whole))
    vqae.train(was_training)
    return {k: sum(v) / len(v) for k, v in scores.items() if v} | {"volumes": len(dataset)}
