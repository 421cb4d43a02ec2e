"""Whole-slide images from the scanner file: reading, tissue detection, tiling, patch features, heatmaps.

Needs the ``slides`` extra (``pip install 'medattn[slides]'``: openslide-python, openslide-bin,
tifffile). See docs/slides.md.

    from medattn.slides import TileSettings, tile_slide, write_tiles, build_extractor, extract_slides

SYNTHETIC slides to try it on are a generator's: :mod:`medattn.generators.slides` (``medattn wsi synthetic``).
"""

import importlib

#: public name -> submodule defining it; imported on first use (PEP 562), so that importing one light
#: submodule (``medattn.slides.settings``, for the command line's defaults) does not import torch.
_WHERE = {
    "Extractor": "extractors",
    "MacenkoNormalizer": "stain",
    "PatchGeometry": "reader",
    "ResNet50Features": "resnet",
    "StainTextureDescriptor": "descriptor",
    "TileSettings": "settings",
    "Tiles": "tiling",
    "bag_is_synthetic": "mark",
    "best_level": "reader",
    "build_extractor": "extractors",
    "candidate_grid": "tiling",
    "draw_grid": "tiling",
    "draw_heatmap": "heatmap",
    "grid_legend": "tiling",
    "extract_slide": "extract",
    "extract_slides": "extract",
    "fit_stains": "stain",
    "heatmap_mass": "heatmap",
    "is_synthetic": "mark",
    "list_slides": "reader",
    "load_resnet50": "resnet",
    "open_slide": "reader",
    "overlay_legend": "heatmap",
    "otsu_threshold": "tissue",
    "patch_geometry": "reader",
    "prediction_text": "heatmap",
    "rank_and_world": "extract",
    "read_patch": "reader",
    "read_tiles": "tiling",
    "saturation": "tissue",
    "shard": "extract",
    "sharpness": "tissue",
    "slide_heatmap": "heatmap",
    "slide_overlay": "heatmap",
    "slide_mpp": "reader",
    "thumbnail": "reader",
    "tile_overlap": "heatmap",
    "tile_slide": "tiling",
    "tissue_mask": "tissue",
    "white_fraction": "tissue",
    "write_features": "extract",
    "write_tiles": "tiling",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
