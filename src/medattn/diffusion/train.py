"""The two training stages of the 3D VQ diffusion model, as ``medattn train`` runs them (:func:`train_diffusion`).

Stage 1 (``task: diffusion_vqae``, :mod:`medattn.diffusion.vqae_stage`) trains the VQ-AE on p^3 patches; stage 2
(``task: diffusion_transformer``, :mod:`medattn.diffusion.transformer_stage`) trains the absorbing transformer on the
token grids of the frozen stage-1 VQ-AE. Both are training tasks of the supervised training loop
(:func:`medattn.train.loop.fit`, registered in :data:`medattn.catalogue.TRAINING_TASKS`): its epochs and optimizer step
(``train.schedule``, ``train.grad_clip``), metrics.csv, checkpoints (``checkpoints/last`` every epoch with the
optimizer and RNG states, ``checkpoints/best`` at the lowest validation score), the held run folder
(:func:`medattn.train.rundir.run_folder`: locked; ``--overwrite`` deletes the previous run only once the new one has
a checkpoint), ``--resume`` (a stopped run continues exactly) and ``train.tensorboard``. What the stages share is
:mod:`medattn.diffusion.stage`.

The run folder holds ``config.yaml``, ``metrics.csv`` (one row per epoch), ``checkpoints/last`` and
``checkpoints/best`` (safetensors, :mod:`medattn.diffusion.model`'s metadata), ``results.json`` (``synthetic: true``
for SYNTHETIC data). The data are the unlabelled bundle of a registered kind
(:func:`medattn.diffusion.data.volume_bundle`). Single process; fp32; ``train.grad_accum`` 1; ``--init-from`` is not
supported (UserError).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from medattn.diffusion.data import volume_bundle
from medattn.diffusion.stage import check_diffusion_run, diffusion_summary
from medattn.train.defaults import resolve_training
from medattn.train.loop import fit

__all__ = ["check_diffusion_run", "diffusion_summary", "train_diffusion"]


def train_diffusion(config: dict, run_dir: Path, *, overwrite: bool = False, resume: bool = False,
                    init_from: str | None = None, progress: bool = True,
                    log: Callable[[str], None] = print) -> dict:
    """Run the stage ``config["task"]`` names in ``run_dir``; returns its results (also results.json). The config is
    checked before the volumes are read; then :func:`medattn.train.loop.fit` trains the stage."""
    config = {**config, "out": str(run_dir)}
    check_diffusion_run(resolve_training(config)[0], init_from)  # null train keys: the general defaults
    return fit(config, volume_bundle(config), Path(run_dir), resume=resume, overwrite=overwrite, init_from=init_from,
               progress=progress, log=log)
