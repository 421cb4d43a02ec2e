"""The bag members of the realistic family: which tissue, how large the bags, how many tiles carry the finding,
and which question the label asks (:class:`BagSpec`), and the writer that turns a spec into CLAM HDF5 bags.

===================  =======  ============  =============  =========================================================
task                 tissue   tiles a bag   finding        question (target)
===================  =======  ============  =============  =========================================================
``ihc_bags``         IHC      200-1200      2-10% focal    presence (binary)
``ihc_rare``         IHC      400-2500      0.5-3% focal   presence of a rare finding (binary)
``ihc_survival``     IHC      200-1200      share 0-10%    overall survival driven by the share (survival)
``ihc_regression``   IHC      200-1200      share 0-10%    a biomarker level set by the share (regression)
``retina_diffuse``   retina   50-400        15-30% faint   presence of a diffuse finding (binary)
``retina_count``     retina   100-600       0-60 tiles     the number of lesion tiles (regression of a count)
``retina_survival``  retina   100-600       0-60 tiles     overall survival driven by the count (survival)
``retina_large``     retina   2000-20000    0.5-5%         presence in very large bags (binary)
===================  =======  ============  =============  =========================================================

Two tissues (:mod:`.ihc`: scikit-image's immunohistochemistry image, hand-made descriptors, 64 features;
:mod:`.retina`: its fundus photograph, a fixed random convolutional network, 96 features), two extractors,
positive rates from 0.5% to 30%, bags from 50 to 20,000 tiles, and presence, fraction, count and survival
targets: a recipe chosen on some of them is judged on another (docs/realistic_family.md, "The family").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from medattn.outputs import OutputFolder

from . import anatomy, ihc, retina


@dataclass(frozen=True)
class BagSpec:
    """``tissue``: ``ihc`` or ``retina``; ``sizes``: the range of tiles a bag holds (None: the tissue's default);
    ``shares``: the share of positive tiles in a positive bag of a presence task (None: the default);
    ``target``: ``presence`` (labels 0/1), ``share`` (labels are each patient's share of positive tiles) or
    ``count`` (labels are each patient's number of positive tiles); ``strength``: the retina finding's contrast."""

    tissue: str
    sizes: tuple[int, int] | None = None
    shares: tuple[float, float] | None = None
    target: str = "presence"
    strength: tuple[float, float] = (0.5, 0.8)


def write_bags(folder: Path, labels: np.ndarray, acquisition, rng: np.random.Generator,
               spec: BagSpec) -> list[tuple[str, dict]]:
    """One bag per patient under ``folder/features`` in CLAM's layout; ``labels`` as :class:`BagSpec`'s ``target``
    reads them. -> per bag (its name, {"bag size": n}), the statistic the probe scores."""
    from medattn.data.readers.bags import write_bag

    rows = []
    bags = OutputFolder(folder / "features")
    image = anatomy.ihc_image() if spec.tissue == "ihc" else anatomy.retina_image()
    for i, label in enumerate(labels):
        features, coords = _bag(image, label, rng, spec)
        name = f"slide_{i:04d}"
        # real tissue, SYNTHETIC findings: runs on these bags say SYNTHETIC (data.readers.bags)
        write_bag(bags, f"{name}.h5", features, coords, {"synthetic": True})
        rows.append((name, {"bag size": float(len(features))}))
    return rows


def _bag(image: np.ndarray, label, rng: np.random.Generator, spec: BagSpec) -> tuple[np.ndarray, np.ndarray]:
    """One bag of ``spec``'s tissue for one patient's ``label``."""
    count = int(label) if spec.target == "count" else None
    if spec.tissue == "ihc":
        share = float(label) if spec.target == "share" else None
        return ihc.ihc_bag(image, bool(label), rng, share=share, sizes=spec.sizes, shares=spec.shares, count=count)
    if spec.target == "share":
        share = float(label)
    else:
        share = float(rng.uniform(*spec.shares)) if label and spec.target == "presence" else 0.0
    return retina.retina_bag(image, rng, spec.sizes or (200, 1200), share=share, count=count,
                             strength=spec.strength)
