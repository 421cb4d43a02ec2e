"""Stage 2 of the 3D VQ diffusion model (``task: diffusion_transformer``), a training task of the training loop.

The frozen stage-1 VQ-AE (``diffusion.vqae_checkpoint``; kept in every stage-2 checkpoint) encodes every training and
validation volume once, on first use (after a resumed run's weights are loaded); batches of ``train.batch_size``
token grids train the absorbing transformer (:func:`~medattn.diffusion.transformer.absorbing_loss`,
``diffusion.timesteps``). Validation: the same loss with masks drawn from a fixed seed (``seed + 1``: the same masks
every epoch); the best epoch has the lowest. Test: every test volume is inpainted with the centre mask
(``diffusion.mask_fraction``) by the transformer of ``checkpoints/best`` (``diffusion.sample_steps``,
``diffusion.temperature``) and by the ``random`` baseline; mean PSNR/SSIM go to results.json
(:func:`inpainting_scores`).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from medattn.diffusion.data import volume_shape
from medattn.diffusion.inpaint import centre_mask, inpaint, score_case, tokens_to_voxels, versus_random
from medattn.diffusion.model import DiffusionModel, build_transformer, load_stage
from medattn.diffusion.stage import DiffusionStage, volume
from medattn.diffusion.transformer import absorbing_loss, mask_schedule, masked_ce
from medattn.diffusion.vqae import encode_volume
from medattn.train.training_tasks import Batches, Built, Planned, Validation

FIELDS = ("epoch", "lr", "train_loss", "val_loss", "seconds")


class TransformerStage(DiffusionStage):
    """The absorbing transformer over the frozen VQ-AE's token grids (see the module docstring)."""

    fields = FIELDS

    def build(self, planned: Planned, device: torch.device, resumed: dict | None,
              init_from: str | Path | None) -> Built:
        config = planned.config
        self.start(config, device)
        stage1, stage1_meta = load_stage(self.diff_cfg["vqae_checkpoint"])
        self.stage1_config = stage1_meta["config"]
        vqae = stage1.vqae.to(device).eval()
        for parameter in vqae.parameters():
            parameter.requires_grad_(False)
        transformer = build_transformer(config, vqae, volume_shape(self.bundle)).to(device)
        self.model = DiffusionModel(vqae, transformer)
        self.log(f"token grid {'x'.join(map(str, transformer.grid))} = {transformer.num_tokens} tokens of "
                 f"{vqae.num_codebooks} x {vqae.codebook_size}-way indices; attention {config['model']['attention']}")
        self.val_masks = mask_schedule(len(self.bundle.val), transformer.num_tokens, self.diff_cfg["timesteps"],
                                       torch.Generator().manual_seed(config["seed"] + 1), device)[1]
        self.tokens: dict[str, torch.Tensor] = {}
        return Built(self.model, transformer, transformer, math.ceil(len(self.bundle.train) /
                                                                     config["train"]["batch_size"]))

    def _tokens(self, split: str) -> torch.Tensor:
        """(n, N, G) token grids of a split's volumes by the model's VQ-AE, flattened in (h, w, d) order; encoded
        once, at first use."""
        if split not in self.tokens:
            dataset, vqae = getattr(self.bundle, split), self.model.vqae
            grids = [encode_volume(vqae, volume(dataset, i).to(self.device)) for i in range(len(dataset))]
            self.tokens[split] = torch.cat(grids).flatten(1, 3)
        return self.tokens[split]

    def batches(self, epoch: int) -> Batches:
        tokens = self._tokens("train")
        order = torch.randperm(len(tokens), generator=self.generator).split(self.config["train"]["batch_size"])
        return Batches(len(order), ({"tokens": tokens[indices.to(self.device)]} for indices in order))

    def batch_loss(self, model, batch: dict) -> tuple[torch.Tensor, float, dict[str, float]]:
        return absorbing_loss(model, batch["tokens"], self.diff_cfg["timesteps"], self.generator), 1, {}

    def validate(self, model: DiffusionModel, epoch: int, progress: bool) -> Validation:
        model.transformer.eval()
        with torch.no_grad():
            val_loss = float(masked_ce(model.transformer, self._tokens("val"), self.val_masks))
        return Validation(val_loss, val_loss, {"val_loss": val_loss}, self.meta(epoch), f"val loss {val_loss:.4f}")

    def test(self, run_dir: Path, results: dict, progress: bool, started: float, case_pictures) -> dict:
        """Centre inpainting of the test volumes by ``checkpoints/best`` and by ``random`` (``case_pictures``: none
        here)."""
        best, _ = load_stage(run_dir / "checkpoints" / "best")
        test, warnings = inpainting_scores(best.to(self.device), self.bundle.test, self.diff_cfg, self.config["seed"])
        return self.finish(run_dir, {**results, "test": test, "warnings": warnings})


def inpainting_scores(model: DiffusionModel, dataset, diff_cfg: dict, seed: int) -> tuple[dict, list[str]]:
    """Mean scores (:func:`~medattn.diffusion.inpaint.score_case`) of centre-mask inpainting by the
    transformer (``diffusion``) and by the ``random`` baseline over a dataset's volumes; case ``i`` uses
    seed ``seed + i`` for both. -> (scores, warnings: diffusion no better than random,
    :func:`~medattn.diffusion.inpaint.versus_random`)."""
    cell = model.vqae.patch_size // model.vqae.latent_size
    unknown = centre_mask(model.transformer.grid, diff_cfg["mask_fraction"])
    voxels = tokens_to_voxels(unknown, cell)
    rows: dict[str, list] = {"diffusion": [], "random": []}
    identical = True  # every case's diffusion output equal to its random codes' (both seeded per case)
    for index in range(len(dataset)):
        whole = dataset[index]["input"].float()
        results = {method: inpaint(model, whole, unknown, method, diff_cfg["sample_steps"], diff_cfg["temperature"],
                                   seed + index) for method in rows}
        for method, result in results.items():
            rows[method].append(score_case(result["output"], whole[0], result["reconstruction"], voxels))
        identical = identical and torch.equal(results["diffusion"]["output"], results["random"]["output"])
    out: dict = {method: {key: sum(r[key] for r in cases) / len(cases) for key in cases[0]}
                 for method, cases in rows.items()}
    warning = versus_random(out["diffusion"], out["random"], identical)
    out["masked_tokens"] = int(unknown.sum())
    out["volumes"] = len(dataset)
    return out, [warning] if warning else []
