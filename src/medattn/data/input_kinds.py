"""Input kinds: what one model input is (a 2D image, a 3D volume, a bag of tile features), one class each.

The kind's name (``image2d``, ``volume3d``, ``bag``) is what a task (:class:`~medattn.data.base.TaskInfo`), the
preprocessing description, a checkpoint and an exported file store; :func:`of` turns it into the object of
:data:`KINDS`, and whatever depends on the kind is asked of that object, never of the name:

==============================  ==================================================================================
question                        answer
==============================  ==================================================================================
one input's shape               ``spatial_dims``: (C, H, W) 2, (C, H, W, D) 3, (F,) 0 (a bag's length N aside)
the stored preprocessing        ``channel_statistics`` (a mean and std per channel)
which loader reads a file       :meth:`InputKind.loader`; a folder given: ``folder_suffixes``, ``reads_folders``;
                                several files in one sample: ``joins_files``; an unreadable file: ``placeholder``
which tensors the model takes   ``contract`` (the models' ``input_contract``), :meth:`InputKind.model_sizes`,
                                :meth:`InputKind.keywords`, :meth:`InputKind.forward`
training                        ``instances`` (``train.instance_dropout``), :meth:`InputKind.statistic`
the export                      ``input_names``, :meth:`InputKind.graph_inputs`, :meth:`InputKind.example_inputs`
what explain writes             ``explain_suffixes``, :meth:`InputKind.header`, :meth:`InputKind.one`,
                                :meth:`InputKind.explain_file`
how a report shows a case       :meth:`InputKind.show_case`
==============================  ==================================================================================

Drawing belongs to ``medattn.explain``, a higher layer: the two explain methods take a :class:`Heatmaps` (one
method per way of drawing a relevance map) that explain implements, and call the one their kind needs.
A new kind is one subclass here and one line in :data:`KINDS` (docs/architecture.md, "Where a new part goes");
``tests/house/test_input_kinds.py`` asks every registered kind every question, and fails when a comparison with a
kind's name appears outside this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from torch import nn

    from ..vocabulary.preprocessing import Preprocessing

#: The largest size of a dynamic axis of an exported graph.
MAX_DIM = 1 << 20


class Heatmaps(Protocol):
    """Where explain puts one relevance map, by how it is drawn (``medattn.explain`` implements it twice: the
    files of ``medattn explain`` -> the names written, and a report's case pictures -> a picture). ``relevance``
    is a CPU float tensor or array on the grid of the drawn thing."""

    def image(self, image: np.ndarray, relevance) -> object:
        """A 2D image (C, H, W) in [0, 1] with ``relevance`` (H, W) over it."""

    def volume(self, volume: np.ndarray, relevance) -> object:
        """A volume (H, W, D) with ``relevance`` (H, W, D)."""

    def tiles(self, coords: np.ndarray, relevance) -> object:
        """Tiles at ``coords`` (N, 2) with one score each, ``relevance`` (N,)."""


def _batch_dim():
    return torch.export.Dim("batch", min=1, max=MAX_DIM)


def _rescaled(x: torch.Tensor) -> np.ndarray:
    """A prepared input (C, ...) as float numbers in [0, 1] (its own minimum to its own maximum)."""
    shown = x.float().numpy()
    return (shown - shown.min()) / max(float(np.ptp(shown)), 1e-12)


class InputKind:
    """One kind of model input; the subclasses below set the attributes and override what differs.

    Attributes:

    * ``name``: the stored name; ``noun``: its inputs in a sentence ("images").
    * ``spatial_dims``: spatial axes of one input (2, 3; 0 for a bag, whose input is (N, F)).
    * ``contract``: what a model's ``forward`` must take to run on it, as models declare it (``input_contract``,
      :func:`medattn.models.input_contract`): ``"image"`` (B, C, *spatial) or ``"bag"`` (features, mask, coords).
    * ``instances``: an input is a set of N instances, N varying: batches are padded and carry ``mask`` (B, N)
      and ``coords`` (B, N, 2); ``train.instance_dropout`` and ``data.max_instances`` apply.
    * ``channel_statistics``: the preprocessing normalises each of the C channels with a stored ``mean`` and
      ``std`` (C values each).
    * ``folder_suffixes``: the files a folder given to predict or explain is searched for (sorted, not recursive);
      ``reads_folders``: a folder is one input instead (a DICOM series).
    * ``joins_files``: several files may make one sample (a patient's slides joined into one bag).
    * ``input_names``: the exported graph's inputs, in order (:meth:`graph_inputs`).
    * ``explain_suffixes``: what ``medattn explain`` may write per input, after its stem (planned before writing).
    * ``statistic_name``: what :meth:`statistic` measures, in a warning.
    """

    name: str
    noun: str
    spatial_dims: int
    contract: str = "image"
    instances: bool = False
    channel_statistics: bool = False
    folder_suffixes: tuple[str, ...] = ()
    reads_folders: bool = False
    joins_files: bool = False
    input_names: tuple[str, ...] = ("x",)
    explain_suffixes: tuple[str, ...] = ()
    statistic_name: str = "image mean intensity"

    def __repr__(self) -> str:
        return f"<input kind {self.name}>"

    # --- files ------------------------------------------------------------------------------------------------

    def loader(self, prep: Preprocessing):
        """record -> {"input": tensor, ...}: the data layer's loader of one file as ``prep`` describes it."""
        raise NotImplementedError

    def placeholder(self, input_shape: tuple[int, ...]) -> dict:
        """A zero sample of ``input_shape`` (``{"input": ...}``), standing for a file that could not be read."""
        return {"input": torch.zeros(input_shape)}

    # --- the model --------------------------------------------------------------------------------------------

    def model_sizes(self, input_shape: tuple[int, ...]) -> dict:
        """The model arguments the data sets: ``in_chans`` and ``img_size`` (the model's grid is the data's grid;
        given only to a model that takes it) from (C, *spatial), or ``feature_dim`` from (F,)."""
        return {"in_chans": input_shape[0], "img_size": tuple(input_shape[1:])}

    def keywords(self, batch: dict) -> dict:
        """The model's keyword tensors beside ``batch["input"]`` (none for images and volumes)."""
        return {}

    def forward(self, model: nn.Module, batch: dict) -> torch.Tensor:
        """Logits (B, K) (segmentation (B, K, *spatial)) of a collated batch: ``model(input, **keywords)``."""
        return model(batch["input"], **self.keywords(batch))

    def statistic(self, batch: dict) -> torch.Tensor:
        """(B,) float64: a statistic a model should not merely follow (:attr:`statistic_name`): here the mean
        intensity of the input as the model sees it."""
        return batch["input"].flatten(1).double().mean(1)

    # --- the export -------------------------------------------------------------------------------------------

    def graph_inputs(self, batch: dict) -> tuple[torch.Tensor, ...]:
        """A collated batch as the exported graph's inputs, in the order of :attr:`input_names`."""
        return (batch["input"],)

    def example_inputs(self, input_shape: tuple[int, ...], any_size: bool = False, batch: int = 2, tokens: int = 10,
                       generator: torch.Generator | None = None) -> tuple[tuple[torch.Tensor, ...], tuple, list[str]]:
        """-> (random inputs for a model of ``input_shape``, their dynamic shapes for ``torch.export``, the input
        names). The batch axis is dynamic; ``any_size``: the model declares that it takes any input size.
        Example sizes differ from one another so that no dynamic axis is mistaken for another or specialised to 1."""
        return ((torch.randn(batch, *input_shape, generator=generator),), ({0: _batch_dim()},),
                list(self.input_names))

    # --- explain ----------------------------------------------------------------------------------------------

    def header(self, path: Path) -> tuple[int, dict]:
        """(instances, attributes) of a file, read from its header without the data: (0, {}) but for bags."""
        return 0, {}

    def one(self, sample: dict, device: torch.device | None = None) -> tuple[torch.Tensor, dict]:
        """A sample as a batch of one: (input (1, ...), the model's keyword tensors), on ``device`` if given."""
        x = sample["input"][None]
        return (x if device is None else x.to(device)), {}

    def explain_file(self, heatmaps: Heatmaps, path: Path, sample: dict, relevance: torch.Tensor):
        """What ``medattn explain`` writes for the file ``path`` (prepared as ``sample``) with ``relevance`` on
        the model's input grid: the call of ``heatmaps`` this kind makes (-> what it returns)."""
        raise NotImplementedError

    def show_case(self, heatmaps: Heatmaps, sample: dict, relevance: torch.Tensor):
        """How a report shows a prepared test case with its ``relevance`` (-> what ``heatmaps`` returns), or None
        where there is nothing to draw."""
        raise NotImplementedError


class Image2D(InputKind):
    """A 2D image (C, H, W), read from PNG, JPEG, TIFF, BMP or DICOM (or a slice of a volume, ``slice_axis``)."""

    name, noun, spatial_dims = "image2d", "images", 2
    channel_statistics = True
    folder_suffixes = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".dcm")
    explain_suffixes = (".png",)

    def loader(self, prep: Preprocessing):
        from .readers.images import ImageLoader

        return ImageLoader(tuple(prep.input_shape[1:]), prep.input_shape[0], list(prep.mean), list(prep.std))

    def example_inputs(self, input_shape, any_size=False, batch=2, tokens=10, generator=None):
        """As :meth:`InputKind.example_inputs`; a model of any size gets a 6 x 9 image with dynamic H and W."""
        if not any_size:
            return super().example_inputs(input_shape, any_size, batch, tokens, generator)
        dim = torch.export.Dim
        axes = {0: _batch_dim(), 2: dim("height", min=1, max=MAX_DIM), 3: dim("width", min=1, max=MAX_DIM)}
        return (torch.randn(batch, input_shape[0], 6, 9, generator=generator),), (axes,), list(self.input_names)

    def explain_file(self, heatmaps, path, sample, relevance):
        """The file as it is (not as prepared) with the map over it."""
        from .readers.images import read_image

        return heatmaps.image(read_image(path).numpy(), relevance)

    def show_case(self, heatmaps, sample, relevance):
        """The prepared image, rescaled to [0, 1], its first three channels (or the first)."""
        shown = _rescaled(sample["input"])
        return heatmaps.image(shown[:3] if shown.shape[0] >= 3 else shown[:1], relevance)


class Volume3D(InputKind):
    """A 3D volume (C, H, W, D) on the RAS+ grid, read from NIfTI or a DICOM series (a folder)."""

    name, noun, spatial_dims = "volume3d", "volumes", 3
    reads_folders = True
    explain_suffixes = (".nii.gz", "_preview.png")

    def loader(self, prep: Preprocessing):
        from .readers.volumes import VolumeLoader

        return VolumeLoader(prep.spacing, tuple(prep.input_shape[1:]), prep.normalize)

    def explain_file(self, heatmaps, path, sample, relevance):
        """The prepared volume (its one channel) with the map."""
        return heatmaps.volume(sample["input"][0].numpy(), relevance)

    def show_case(self, heatmaps, sample, relevance):
        """The prepared volume (its first channel), rescaled to [0, 1]."""
        return heatmaps.volume(_rescaled(sample["input"])[0], relevance)


class Bag(InputKind):
    """A bag of N tile features (N, F) with tile coordinates (N, 2), read from HDF5 (``medattn wsi extract``)."""

    name, noun, spatial_dims = "bag", "feature bags", 0
    contract, instances, joins_files = "bag", True, True
    folder_suffixes = (".h5", ".hdf5")
    input_names = ("features", "mask", "coords")
    explain_suffixes = ("_tiles.csv", "_tiles.h5", "_tiles.geojson", ".png")
    statistic_name = "bag size"

    def loader(self, prep: Preprocessing):
        from .readers.bags import BagLoader

        return BagLoader(prep.input_shape[0])

    def placeholder(self, input_shape):
        """A bag of one zero instance."""
        return {"input": torch.zeros(1, input_shape[0]), "coords": torch.zeros(1, 2)}

    def model_sizes(self, input_shape):
        return {"feature_dim": input_shape[0]}

    def keywords(self, batch):
        """``mask`` (B, N) bool, True for real instances, and ``coords`` (B, N, 2); None where the batch has none."""
        return {"mask": batch.get("mask"), "coords": batch.get("coords")}

    def statistic(self, batch):
        """The bag size: the real instances of each bag (all N without a mask)."""
        mask = batch.get("mask")
        sizes = mask.sum(1) if mask is not None else torch.full((len(batch["id"]),), batch["input"].shape[1])
        return sizes.double()

    def graph_inputs(self, batch):
        return batch["input"], batch["mask"], batch["coords"]

    def example_inputs(self, input_shape, any_size=False, batch=2, tokens=10, generator=None):
        """``tokens`` instances (a dynamic axis), the last bag padded to half, as batches of unequal bags are."""
        b, n = _batch_dim(), torch.export.Dim("tokens", min=1, max=MAX_DIM)
        features = torch.randn(batch, tokens, input_shape[0], generator=generator)
        mask = torch.ones(batch, tokens, dtype=torch.bool)
        mask[-1, tokens // 2:] = False
        coords = torch.rand(batch, tokens, 2, generator=generator) * 1000
        return (features, mask, coords), tuple({0: b, 1: n} for _ in range(3)), list(self.input_names)

    def header(self, path):
        """(tiles, HDF5 attributes) from the file's header; a UserError naming the file otherwise."""
        from .readers.bags import bag_header

        return bag_header(path)

    def one(self, sample, device=None):
        """(features (1, N, F), {"coords": (1, N, 2)}): one bag needs no mask."""
        x, coords = sample["input"][None], sample["coords"][None]
        if device is not None:
            x, coords = x.to(device), coords.to(device)
        return x, {"coords": coords}

    def explain_file(self, heatmaps, path, sample, relevance):
        """A score per tile, at the tiles' coordinates."""
        return heatmaps.tiles(sample["coords"].numpy(), relevance)

    def show_case(self, heatmaps, sample, relevance):
        """The tiles at their coordinates; None when they have none (all at one place)."""
        coords = sample["coords"].numpy()
        if not np.ptp(coords, axis=0).any():
            return None
        return heatmaps.tiles(coords, relevance)


#: Every input kind by its stored name.
KINDS: dict[str, InputKind] = {kind.name: kind for kind in (Image2D(), Volume3D(), Bag())}


def of(name: str) -> InputKind:
    """The kind stored as ``name``; ValueError for a name that is not in :data:`KINDS`."""
    kind = known(name)
    if kind is None:
        raise ValueError(f"input_kind must be one of {tuple(KINDS)}, got {name!r}")
    return kind


def known(name) -> InputKind | None:
    """The kind stored as ``name``, or None (for any value that names no kind: a damaged file's field)."""
    return KINDS.get(name) if isinstance(name, str) else None


def taken_by(contract: str) -> tuple[InputKind, ...]:
    """The kinds a model whose ``input_contract`` is ``contract`` runs on."""
    return tuple(kind for kind in KINDS.values() if kind.contract == contract)
