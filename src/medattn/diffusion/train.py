"""The two training stages of the 3D VQ diffusion model, as library functions (``medattn train`` calls them).

Stage 1, :func:`train_vqae` (``task: diffusion_vqae``): every training volume is cut into its p^3
patches; patches of the volumes in a shuffled order are gathered and shuffled into batches of
``train.batch_size`` patches; loss :func:`medattn.diffusion.losses.vqae_loss`. Validation: L1 and
PSNR of the reconstructed validation volumes; the best epoch has the lowest validation L1. Test: PSNR
and SSIM of the reconstructed test volumes.

Stage 2, :func:`train_transformer` (``task: diffusion_transformer``): the frozen stage-1 VQ-AE
(``diffusion.vqae_checkpoint``) encodes every training and validation volume once; batches of
``train.batch_size`` token grids train the absorbing transformer (:func:`~medattn.diffusion.transformer.absorbing_loss`,
``diffusion.timesteps``). Validation: the same loss with masks drawn from a fixed seed (the same
masks every epoch); the best epoch has the lowest. Test: every test volume is inpainted with the
centre mask (``diffusion.mask_fraction``) by the transformer (``diffusion.sample_steps``,
``diffusion.temperature``) and by the ``random`` baseline; mean PSNR/SSIM go to results.json.

Both write to the run folder: ``config.yaml``, ``metrics.csv`` (one row per epoch),
``checkpoints/last`` and ``checkpoints/best`` (safetensors), ``results.json`` (``synthetic: true`` for
SYNTHETIC data). The folder is held as for supervised runs (:func:`medattn.train.rundir.run_folder`:
locked; ``--overwrite`` deletes the previous run only once the new one has a checkpoint). The data are the
unlabelled bundle of a registered kind (:func:`medattn.diffusion.data.volume_bundle`); every optimizer step is the
supervised loop's (:func:`medattn.train.optim.optimizer_step`: ``train.schedule``, ``train.grad_clip``). The epochs,
validation, checkpoints and test are the stages' own. Single process; fp32; ``train.grad_accum`` 1; ``--resume``
and ``--init-from`` are not supported (UserError).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from medattn.allocator import keep_freed_memory
from medattn.config import save_config, validate
from medattn.data import DataBundle
from medattn.diffusion.data import volume_bundle, volume_shape
from medattn.diffusion.inpaint import centre_mask, inpaint, score_case, tokens_to_voxels, versus_random
from medattn.diffusion.losses import load_perceptual_net, vqae_loss
from medattn.diffusion.metrics import psnr, ssim
from medattn.diffusion.model import (
    DiffusionModel,
    build_transformer,
    build_vqae,
    check_stage_config,
    load_stage,
    save_stage,
)
from medattn.diffusion.transformer import absorbing_loss, mask_schedule, masked_ce
from medattn.diffusion.vqae import encode_volume, from_patches, patch_grid, to_patches
from medattn.errors import UserError, writing
from medattn.runtime import distributed
from medattn.runtime.device import check_device
from medattn.runtime.outputs import save_json
from medattn.threads import set_threads
from medattn.train.defaults import resolve_training
from medattn.train.loaders import seed_everything
from medattn.train.optim import make_optimizer, optimizer_step, step_schedule
from medattn.train.report import append_metrics
from medattn.train.rundir import run_folder

VQAE_FIELDS = ("epoch", "lr", "train_loss", "train_l1", "train_commitment", "val_l1", "val_psnr", "codebook_usage",
               "seconds")
TRANSFORMER_FIELDS = ("epoch", "lr", "train_loss", "val_loss", "seconds")


def check_diffusion_run(config: dict) -> None:
    """Everything cheap about a diffusion config: the schema, the stage, the device, unsupported options."""
    validate(config)
    check_stage_config(config)
    check_device(config["train"]["device"])
    if config["train"]["precision"] != "fp32":
        raise UserError("train.precision: the diffusion stages train in fp32 only")
    if config["train"]["grad_accum"] != 1:
        raise UserError("train.grad_accum: the diffusion stages take no gradient accumulation (set 1)")
    if config["diffusion"]["perceptual_weight"] > 0 and not config["diffusion"]["perceptual_net"]:
        raise UserError("diffusion.perceptual_weight > 0 needs diffusion.perceptual_net (a local .pt2 file)")


def train_diffusion(config: dict, run_dir: Path, *, overwrite: bool = False, resume: bool = False,
                    init_from: str | None = None, log: Callable[[str], None] = print) -> dict:
    """Run the stage ``config["task"]`` names in ``run_dir``; returns its results (also results.json)."""
    if resume or init_from:
        raise UserError("--resume and --init-from are not supported by the diffusion stages")
    config = {**resolve_training(config)[0], "out": str(run_dir)}  # null train keys: the general defaults
    if config["train"]["epochs"] is None:
        raise UserError("the diffusion stages need train.epochs (the packaged configs state the papers' budgets)")
    check_diffusion_run(config)
    if distributed.world_size() > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError("the diffusion stages run in one process (no torchrun)")
    device = distributed.setup(config["train"]["device"])
    stage = train_vqae if config["task"] == "diffusion_vqae" else train_transformer
    run_dir = Path(run_dir)
    with run_folder(run_dir, False, overwrite):
        return stage(config, run_dir, device, log)


def _start(config: dict, run_dir: Path, log: Callable[[str], None]) -> DataBundle:
    set_threads(config["train"]["threads"], log)
    keep_freed_memory()  # large tensors reuse freed pages (medattn.allocator)
    seed_everything(config["seed"])
    with writing(run_dir / "config.yaml"):
        save_config(config, run_dir / "config.yaml")
    return volume_bundle(config)


def _volume(dataset, index: int) -> torch.Tensor:
    """(1, 1, H, W, D) float32 of one sample."""
    return dataset[index]["input"][None].float()


def _finish(run_dir: Path, config: dict, bundle: DataBundle, results: dict, log: Callable[[str], None]) -> dict:
    results = {"task": config["task"], "synthetic": bundle.task.synthetic, "volume_shape": list(volume_shape(bundle)),
               **results}
    save_json(run_dir / "results.json", results)
    log(diffusion_summary(results, run_dir))
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


def _meta(config: dict, bundle: DataBundle, epoch: int, extra: dict | None = None) -> dict:
    return {"config": config, "diffusion": {"stage": config["task"], "volume_shape": list(volume_shape(bundle)),
                                            "synthetic": bundle.task.synthetic, "epoch": epoch, **(extra or {})}}


def train_vqae(config: dict, run_dir: Path, device: torch.device,
               log: Callable[[str], None]) -> dict:
    """Stage 1 inside its held run folder (see the module docstring)."""
    bundle = _start(config, run_dir, log)
    diff_cfg, train_cfg = config["diffusion"], config["train"]
    vqae = build_vqae(config).to(device)
    p = vqae.patch_size
    per_volume = math.prod(patch_grid(volume_shape(bundle), p))
    perceptual = None
    if diff_cfg["perceptual_weight"] > 0:
        perceptual = load_perceptual_net(diff_cfg["perceptual_net"]).to(device)
    elif diff_cfg["gradient_weight"] == 0:
        log("perceptual term off (diffusion.perceptual_weight 0): the paper's VGG loss needs ImageNet weights, which "
            "are not downloaded; set diffusion.perceptual_net (a local .pt2) or diffusion.gradient_weight "
            "(weight-free) to add one")
    model = DiffusionModel(vqae)
    optimizer = make_optimizer(vqae, train_cfg)
    batch = train_cfg["batch_size"]
    schedule = step_schedule(train_cfg, math.ceil(len(bundle.train) * per_volume / batch))
    generator = torch.Generator().manual_seed(config["seed"])
    state, best = {"step": 0}, None
    for epoch in range(1, train_cfg["epochs"] + 1):
        started, vqae = time.perf_counter(), vqae.train()
        sums = {"loss": 0.0, "l1": 0.0, "commitment": 0.0}
        count, pool = 0, torch.empty(0, vqae.in_chans, p, p, p)
        order = torch.randperm(len(bundle.train), generator=generator).tolist()
        for position, index in enumerate(order):
            pool = torch.cat([pool, to_patches(_volume(bundle.train, index), p)])
            pool = pool[torch.randperm(len(pool), generator=generator)]
            last = position == len(order) - 1
            while len(pool) >= batch or (last and len(pool)):
                patches, pool = pool[:batch].to(device), pool[batch:]
                recon, _, commitment = vqae(patches)
                loss, parts = vqae_loss(recon, patches, commitment, perceptual, diff_cfg["perceptual_weight"],
                                        diff_cfg["gradient_weight"])
                loss.backward()
                lr = optimizer_step(vqae, optimizer, state, schedule, train_cfg)
                count += 1
                sums["loss"] += float(loss.detach())
                sums["l1"] += parts["l1"]
                sums["commitment"] += parts["commitment"]
        val = _reconstruction_scores(vqae, bundle.val, device, with_ssim=False)
        row = {"epoch": epoch, "lr": lr, **{f"train_{k}": v / max(count, 1) for k, v in sums.items()},
               "val_l1": val["l1"], "val_psnr": val["psnr"], "codebook_usage": float(vqae.codebook.usage().mean()),
               "seconds": time.perf_counter() - started}
        save_stage(run_dir / "checkpoints" / "last", model, _meta(config, bundle, epoch))
        if best is None or val["l1"] < best[1]:
            best = (epoch, val["l1"])
            save_stage(run_dir / "checkpoints" / "best", model, _meta(config, bundle, epoch))
        append_metrics(run_dir / "metrics.csv", row, VQAE_FIELDS)
        log(f"epoch {epoch}: train loss {row['train_loss']:.4f}, val L1 {val['l1']:.4f}, val PSNR {val['psnr']:.2f} "
            f"dB, codebook usage {row['codebook_usage']:.2f}")
    best_model, _ = load_stage(run_dir / "checkpoints" / "best")
    test = _reconstruction_scores(best_model.vqae.to(device), bundle.test, device, with_ssim=True)
    return _finish(run_dir, config, bundle, {"best_epoch": best[0], "test": test}, log)


@torch.no_grad()
def _reconstruction_scores(vqae, dataset, device: torch.device, with_ssim: bool) -> dict:
    """Mean L1, PSNR (and SSIM) of whole volumes passed through the VQ-AE (eval mode)."""
    was_training = vqae.training
    vqae.eval()
    scores: dict[str, list[float]] = {"l1": [], "psnr": [], "ssim": []}
    for index in range(len(dataset)):
        volume = _volume(dataset, index)
        grid = patch_grid(tuple(volume.shape[2:]), vqae.patch_size)
        patches = to_patches(volume, vqae.patch_size).to(device)
        recon = from_patches(torch.cat([vqae(chunk)[0] for chunk in patches.split(64)]), grid).cpu()
        scores["l1"].append(float((recon - volume).abs().mean()))
        scores["psnr"].append(psnr(recon.clamp(0, 1), volume))
        if with_ssim:
            scores["ssim"].append(ssim(recon.clamp(0, 1), volume))
    vqae.train(was_training)
    return {k: sum(v) / len(v) for k, v in scores.items() if v} | {"volumes": len(dataset)}


def _encode_all(vqae, dataset, device: torch.device) -> torch.Tensor:
    """(n, N, G) token grids of a dataset's volumes, flattened in (h, w, d) order."""
    grids = [encode_volume(vqae, _volume(dataset, i).to(device)) for i in range(len(dataset))]
    return torch.cat(grids).flatten(1, 3)


def train_transformer(config: dict, run_dir: Path, device: torch.device,
                      log: Callable[[str], None]) -> dict:
    """Stage 2 inside its held run folder (see the module docstring)."""
    bundle = _start(config, run_dir, log)
    diff_cfg, train_cfg = config["diffusion"], config["train"]
    stage1, stage1_meta = load_stage(diff_cfg["vqae_checkpoint"])
    vqae = stage1.vqae.to(device).eval()
    for parameter in vqae.parameters():
        parameter.requires_grad_(False)
    transformer = build_transformer(config, vqae, volume_shape(bundle)).to(device)
    model = DiffusionModel(vqae, transformer)
    log(f"token grid {'x'.join(map(str, transformer.grid))} = {transformer.num_tokens} tokens of "
        f"{vqae.num_codebooks} x {vqae.codebook_size}-way indices; attention {config['model']['attention']}")
    train_tokens, val_tokens = _encode_all(vqae, bundle.train, device), _encode_all(vqae, bundle.val, device)
    optimizer = make_optimizer(transformer, train_cfg)
    batch, timesteps = train_cfg["batch_size"], diff_cfg["timesteps"]
    schedule = step_schedule(train_cfg, math.ceil(len(train_tokens) / batch))
    generator = torch.Generator().manual_seed(config["seed"])
    val_masks = mask_schedule(len(val_tokens), transformer.num_tokens, timesteps,
                              torch.Generator().manual_seed(config["seed"] + 1), device)[1]
    extra = {"vqae_config": stage1_meta["config"]}
    state, best = {"step": 0}, None
    for epoch in range(1, train_cfg["epochs"] + 1):
        started = time.perf_counter()
        transformer.train()
        total, count = 0.0, 0
        for indices in torch.randperm(len(train_tokens), generator=generator).split(batch):
            loss = absorbing_loss(transformer, train_tokens[indices.to(device)], timesteps, generator)
            loss.backward()
            lr = optimizer_step(transformer, optimizer, state, schedule, train_cfg)
            total, count = total + float(loss.detach()), count + 1
        transformer.eval()
        with torch.no_grad():
            val_loss = float(masked_ce(transformer, val_tokens, val_masks))
        row = {"epoch": epoch, "lr": lr, "train_loss": total / count, "val_loss": val_loss,
               "seconds": time.perf_counter() - started}
        save_stage(run_dir / "checkpoints" / "last", model, _meta(config, bundle, epoch, extra))
        if best is None or val_loss < best[1]:
            best = (epoch, val_loss)
            save_stage(run_dir / "checkpoints" / "best", model, _meta(config, bundle, epoch, extra))
        append_metrics(run_dir / "metrics.csv", row, TRANSFORMER_FIELDS)
        log(f"epoch {epoch}: train loss {row['train_loss']:.4f}, val loss {val_loss:.4f}")
    best_model, _ = load_stage(run_dir / "checkpoints" / "best")
    test, warnings = inpainting_scores(best_model.to(device), bundle.test, diff_cfg, config["seed"])
    return _finish(run_dir, config, bundle, {"best_epoch": best[0], "test": test, "warnings": warnings}, log)


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
        volume = dataset[index]["input"].float()
        results = {method: inpaint(model, volume, unknown, method, diff_cfg["sample_steps"], diff_cfg["temperature"],
                                   seed + index) for method in rows}
        for method, result in results.items():
            rows[method].append(score_case(result["output"], volume[0], result["reconstruction"], voxels))
        identical = identical and torch.equal(results["diffusion"]["output"], results["random"]["output"])
    out: dict = {method: {key: sum(r[key] for r in cases) / len(cases) for key in cases[0]}
                 for method, cases in rows.items()}
    warning = versus_random(out["diffusion"], out["random"], identical)
    out["masked_tokens"] = int(unknown.sum())
    out["volumes"] = len(dataset)
    return out, [warning] if warning else []
