"""The data of a diffusion run: an unlabelled volume bundle of a registered data kind.

The kinds are ``catalogue.UNLABELLED_KINDS`` (``synthetic_brain``:
:func:`medattn.generators.synthetic_brain.build_synthetic_brain`; ``nifti_volumes``:
:func:`medattn.data.kinds.nifti_volumes.build_nifti_volumes`), built by :func:`medattn.data.build_datasets` like every
kind; their samples are ``{"input": (1, H, W, D) float32, "id": str}`` and their task (type ``unlabelled``) gives
the volume size and the SYNTHETIC flag.
"""

from __future__ import annotations

from medattn.catalogue import UNLABELLED_KINDS
from medattn.data import DataBundle, build_datasets
from medattn.errors import UserError

KINDS = UNLABELLED_KINDS


def volume_bundle(config: dict) -> DataBundle:
    """The volumes of a diffusion run's ``data`` section (seeded by its ``seed``); each split of one size, and at
    least one validation and one test volume (UserError otherwise)."""
    kind = config["data"].get("kind")
    if kind not in KINDS:
        raise UserError(f"data.kind: the diffusion tasks read {', '.join(KINDS)}, got {kind!r}")
    bundle = build_datasets(config["data"], config["seed"])
    if len(bundle.val) == 0 or len(bundle.test) == 0:
        raise UserError("data: the diffusion stages need at least one validation and one test volume")
    return bundle


def volume_shape(bundle: DataBundle) -> tuple[int, int, int]:
    """(H, W, D) of every volume of a :func:`volume_bundle`."""
    return tuple(bundle.task.input_shape[1:])
