"""Tiling options and their command-line defaults; imports nothing heavy, so `medattn wsi --help` is fast."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError


@dataclass(frozen=True)
class TileSettings:
    """Tiling options with the defaults of the command line (docs/slides.md explains each threshold)."""

    patch_um: float = 256.0  # patch side in microns (the SeqNorm paper: 256 um)
    patch_px: int = 256  # patch side after resizing (the paper: 256 px)
    mpp: float | None = None  # microns per level-0 pixel; None: from the slide
    thumbnail_px: int = 2048  # longer side of the thumbnail the tissue mask is computed on
    min_saturation: float = 0.08  # floor of the Otsu threshold on saturation
    min_tissue_area_um2: float = 20_000.0  # tissue pieces smaller than this are dropped (0.02 mm^2)
    min_tissue_fraction: float = 0.25  # a grid cell is a candidate with this much of it in the mask
    white_level: int = 220  # a pixel is white when R, G and B are all >= this
    max_white: float = 0.5  # a patch with more white than this is dropped
    min_sharpness: float = 20.0  # a patch whose Laplacian variance (grey levels^2) is below is dropped

    def check(self) -> None:
        """UserError naming the option that is out of range."""
        for name, ok in (("patch_um", self.patch_um > 0), ("patch_px", self.patch_px >= 8),
                         ("thumbnail_px", self.thumbnail_px >= 64),
                         ("min_tissue_fraction", 0 <= self.min_tissue_fraction <= 1),
                         ("max_white", 0 <= self.max_white <= 1), ("white_level", 0 <= self.white_level <= 255),
                         ("min_sharpness", self.min_sharpness >= 0), ("min_saturation", 0 <= self.min_saturation < 1),
                         ("min_tissue_area_um2", self.min_tissue_area_um2 >= 0)):
            if not ok:
                raise UserError(f"--{name.replace('_', '-')} out of range: {getattr(self, name)}")


DEFAULT_SETTINGS = TileSettings()


def settings_changes(stored: dict, settings: TileSettings) -> list[str]:
    """The options in which ``settings`` differ from ``stored`` (a :class:`TileSettings` as a dict, as outputs
    record it), as ``"--name OLD -> NEW"``; an option the record lacks counts as changed."""
    from dataclasses import asdict

    return [f"--{name.replace('_', '-')} {stored.get(name, 'unrecorded')} -> {value}"
            for name, value in asdict(settings).items() if stored.get(name, object()) != value]
