"""Whole-slide images from the scanner file: reading, tissue detection, tiling, patch features, heatmaps.

Needs the ``slides`` extra (``pip install 'medattn[slides]'``: openslide-python, openslide-bin,
tifffile). See docs/slides.md.

    from medattn.slides import TileSettings, tile_slide, write_tiles, build_extractor, extract_slides
"""

from .descriptor import StainTextureDescriptor
from .extract import extract_slide, extract_slides, rank_and_world, shard, write_features
from .extractors import Extractor, build_extractor
from .heatmap import draw_heatmap, heatmap_mass, slide_heatmap, tile_overlap
from .reader import PatchGeometry, best_level, list_slides, open_slide, patch_geometry, read_patch, slide_mpp, thumbnail
from .resnet import ResNet50Features, load_resnet50
from .stain import MacenkoNormalizer, fit_stains
from .synthetic import SyntheticSlide, load_truth, write_synthetic_cohort, write_synthetic_slide
from .tiling import Tiles, TileSettings, candidate_grid, draw_grid, read_tiles, tile_slide, write_tiles
from .tissue import otsu_threshold, saturation, sharpness, tissue_mask, white_fraction

__all__ = [
    "Extractor", "MacenkoNormalizer", "PatchGeometry", "ResNet50Features", "StainTextureDescriptor", "SyntheticSlide",
    "TileSettings", "Tiles", "best_level", "build_extractor", "candidate_grid", "draw_grid", "draw_heatmap",
    "extract_slide", "extract_slides", "fit_stains", "heatmap_mass", "list_slides", "load_resnet50", "load_truth",
    "open_slide", "otsu_threshold", "patch_geometry", "rank_and_world", "read_patch", "read_tiles", "saturation",
    "shard", "sharpness", "slide_heatmap", "slide_mpp", "thumbnail", "tile_overlap", "tile_slide", "tissue_mask",
    "white_fraction", "write_features", "write_synthetic_cohort", "write_synthetic_slide", "write_tiles",
]
