"""MedMNIST-style ``.npz`` files given by path (nothing is downloaded).

The file holds ``{train,val,test}_images`` and ``{train,val,test}_labels``. Images are 2D (N, H, W)
or (N, H, W, C) with C in {1, 3}, or 3D (N, D, H, W); a 4D array whose last axis is 1 or 3 is read as
2D unless ``spatial_dims: 3`` says otherwise. Labels are (N,) or (N, K). 3D samples are returned as
(1, H, W, D), the layout of every volume in medattn. uint8 images are divided by 255, others min-max
scaled over the split, then ``(x - mean) / std``. The file's own splits are used; every sample is its
own patient. The file is read with ``allow_pickle=False``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ...errors import UserError
from ..base import DataBundle, TaskInfo
from ..cohort.labels import infer_label_spec, inferred_class_problems, label_options
from ..options import SPLITS, check_keys, int_tuple, require
from ..preprocessing import Preprocessing
from ..readers.images import match_channels
from ..tables import BadSamples
from ..transforms import RandomFlip3d, RandomRotateFlip2d

KEYS = frozenset({"path", "task_type", "classes", "num_classes", "spatial_dims", "image_size", "in_chans", "mean",
                  "std", "augment"})


class ArrayDataset(Dataset):
    """Samples from in-memory arrays: ``images`` (N, C, *spatial) float in [0, 1], labels, ids."""

    def __init__(self, images: torch.Tensor, labels: list[torch.Tensor], ids: list[str], size: tuple[int, ...],
                 mean: float, std: float, in_chans: int, transform=None) -> None:
        self.images, self.labels, self.ids = images, labels, ids
        self.size, self.mean, self.std, self.in_chans, self.transform = size, mean, std, in_chans, transform

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        image = self.images[index].float()
        if self.images.dtype == torch.uint8:
            image = image / 255.0
        if tuple(image.shape[1:]) != self.size:
            mode = "bilinear" if image.ndim == 3 else "trilinear"
            image = F.interpolate(image[None], size=self.size, mode=mode, align_corners=False)[0]
        if image.ndim == 3:
            image = match_channels(image, self.in_chans)
        if self.transform is not None:
            image = self.transform(image)
        return {"input": (image - self.mean) / self.std, "label": self.labels[index], "id": self.ids[index],
                "patient": self.ids[index]}


def _images(array: np.ndarray, spatial_dims: int | None, where: str) -> torch.Tensor:
    """-> (N, C, H, W) or (N, 1, H, W, D), uint8 kept, other dtypes min-max scaled to [0, 1]."""
    if array.ndim == 3:
        spatial_dims, array = 2, array[:, None]
    elif array.ndim == 4 and spatial_dims != 3 and array.shape[-1] in (1, 3):
        spatial_dims, array = 2, array.transpose(0, 3, 1, 2)
    elif array.ndim == 4 and spatial_dims in (None, 3):
        spatial_dims, array = 3, array.transpose(0, 2, 3, 1)[:, None]  # (N, D, H, W) -> (N, 1, H, W, D)
    else:
        raise UserError(f"{where}: expected images (N, H, W), (N, H, W, C) or (N, D, H, W), got shape {array.shape}")
    if array.dtype == np.uint8:
        return torch.from_numpy(np.ascontiguousarray(array))
    x = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    if not torch.isfinite(x).all():
        raise UserError(f"{where}: the images hold NaN or Inf values")
    low, high = x.min(), x.max()
    return (x - low) / (high - low) if high > low else torch.zeros_like(x)


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The images and labels of every split from the ``.npz`` file; UserError for a missing array or a bad file."""
    names = [f"{s}_{k}" for s in SPLITS for k in ("images", "labels")]
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [n for n in names if n not in npz.files]
            if missing:
                raise UserError(f"medmnist {path}: missing array(s) {', '.join(missing)}; the file has "
                                f"{', '.join(npz.files)}")
            return {n: npz[n] for n in names}
    except (OSError, ValueError, EOFError) as exc:
        raise UserError(f"medmnist {path}: not a readable .npz file ({exc})") from None


def _labels(arrays: dict[str, np.ndarray], images: dict[str, torch.Tensor], path: Path) -> dict[str, np.ndarray]:
    """Split -> its labels as (N, columns), one row per image (UserError otherwise)."""
    labels = {}
    for s in SPLITS:
        raw = arrays[f"{s}_labels"].reshape(len(arrays[f"{s}_labels"]), -1)
        if len(raw) != len(images[s]):
            raise UserError(f"medmnist {path}: {len(images[s])} {s}_images but {len(raw)} {s}_labels")
        labels[s] = raw
    return labels


def _valid_labels(labels: dict[str, np.ndarray], bad: BadSamples, path: Path) -> dict[str, np.ndarray]:
    """Split -> which of its rows hold non-negative integers; each other row is reported to ``bad``."""
    valid = {}
    for s in SPLITS:
        ok = np.isfinite(labels[s]).all(1) & (labels[s] >= 0).all(1) & (labels[s] == np.round(labels[s])).all(1)
        for i in np.flatnonzero(~ok):
            bad.report(f"medmnist {path} {s}_labels[{i}]: label {labels[s][i].tolist()} is not a non-negative integer")
        valid[s] = ok
    return valid


def build_medmnist(cfg: dict, seed: int = 0, skip_bad: bool = False) -> DataBundle:
    """A MedMNIST ``.npz`` file (2D or 3D).

    Keys: ``path`` (required), ``task_type`` (inferred: several label columns = multilabel, 0/1 =
    binary, otherwise multiclass; ChestMNIST's 14 columns are multilabel), ``classes``/``num_classes``,
    ``spatial_dims`` (2 or 3; only to resolve a 4D array with 1 or 3 in the last axis),
    ``image_size`` (resize; default: the file's size), ``in_chans`` (2D: 1 or 3, default the file's
    channels; 3D: 1), ``mean``/``std`` (default 0.5/0.5), ``augment`` (default true: 2D rotation and
    vertical flip, 3D flips, training split only). Samples whose labels do not parse are bad samples;
    a missing key, shape mismatch or NaN/Inf images fail for the whole file.
    """
    kind = "medmnist"
    check_keys(cfg, KEYS, kind)
    path = Path(require(cfg, "path", kind))
    if not path.is_file():
        raise UserError(f"medmnist {path}: file not found")
    arrays = _read_arrays(path)
    spatial_dims = cfg.get("spatial_dims")
    images = {s: _images(arrays[f"{s}_images"], spatial_dims, f"medmnist {path} {s}_images") for s in SPLITS}
    dims = {images[s].ndim - 2 for s in SPLITS}
    channels = {images[s].shape[1] for s in SPLITS}
    if len(dims) > 1 or len(channels) > 1 or len({tuple(images[s].shape[2:]) for s in SPLITS}) > 1:
        raise UserError(f"medmnist {path}: the splits' images differ in shape")
    ndim = dims.pop()
    labels = _labels(arrays, images, path)
    columns = ["label"] if labels["train"].shape[1] == 1 else [f"label_{k}" for k in range(labels["train"].shape[1])]
    task_type, classes, num_classes = label_options(cfg)
    if classes is not None:
        raise UserError("medmnist: labels are numbers; give num_classes, not classes")
    bad = BadSamples(skip_bad)
    valid = _valid_labels(labels, bad, path)
    rows = [(s, int(i)) for s in SPLITS for i in np.flatnonzero(valid[s])]
    values = [labels[s][i].tolist() for s, i in rows]
    spec = infer_label_spec(values, columns, task_type, None, num_classes)
    problems, rare = inferred_class_problems(values, [f"medmnist {path} {s}_labels[{i}]" for s, i in rows],
                                             columns[0], spec, num_classes is not None)
    for message in problems:
        bad.report(message)
    for k in rare:
        valid[rows[k][0]][rows[k][1]] = False
    if rare:
        spec = infer_label_spec([v for k, v in enumerate(values) if k not in rare], columns, task_type, None,
                                num_classes)
    in_chans = int(cfg.get("in_chans", channels.pop() if ndim == 2 else 1))
    if (ndim == 2 and in_chans not in (1, 3)) or (ndim == 3 and in_chans != 1):
        raise UserError(f"medmnist: in_chans must be 1 or 3 for 2D and 1 for 3D images, got {in_chans}")
    size = int_tuple(cfg.get("image_size", tuple(images["train"].shape[2:])), ndim, "image_size")
    mean, std = float(cfg.get("mean", 0.5)), float(cfg.get("std", 0.5))
    augment = cfg.get("augment", True)
    datasets = {}
    for s in SPLITS:
        keep, tensors = [], []
        for i in np.flatnonzero(valid[s]):
            try:
                tensors.append(spec.tensor(labels[s][i].tolist()))
            except ValueError as exc:
                bad.report(f"medmnist {path} {s}_labels[{i}]: {exc}")
                continue
            keep.append(int(i))
        transform = None
        if augment and s == "train":
            transform = RandomRotateFlip2d() if ndim == 2 else RandomFlip3d()
        datasets[s] = ArrayDataset(images[s][keep], tensors, [f"{s}-{i}" for i in keep], size, mean, std, in_chans,
                                   transform)
    task = TaskInfo(spec.task_type, "image2d" if ndim == 2 else "volume3d", spec.num_outputs, (in_chans, *size),
                    spec.class_names)
    unpredictable = ("a MedMNIST model reads arrays from its npz (scaled over the split, resized trilinearly); no "
                     "single file is prepared like that: evaluate it with medattn eval")
    return DataBundle(datasets["train"], datasets["val"], datasets["test"], task, skipped=bad.count,
                      preprocessing=Preprocessing.of("medmnist", task, unpredictable=unpredictable))
