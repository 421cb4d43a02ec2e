"""One heatmap of each kind, drawn by ``medattn explain`` from the demo's runs and a SYNTHETIC slide cohort:
a 2D image beside its map, a 3D volume's preview (three orthogonal slices), a slide's tiles over its thumbnail.

    medattn demo --out reports/demo                        # the runs this script explains (about 2 minutes)
    python benchmarks/heatmap_examples.py --demo reports/demo --out reports/heatmaps

It writes a test phantom of each demo task as a file (PNG, NIfTI) in the layout ``medattn predict`` reads,
trains the packaged ``synthetic_slides`` run on a generated cohort (``medattn wsi synthetic/tile/extract``) and
runs ``medattn explain`` on each; the pictures land in ``--out`` (``cxr.png``, ``mri_preview.png``,
``slide_000.png``). All data are SYNTHETIC.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
from PIL import Image

from medattn.cli import main
from medattn.generators import synthetic_breast_mri, synthetic_cxr


def run(argv: list[str]) -> None:
    print("medattn " + " ".join(argv), flush=True)
    if main(argv) != 0:
        raise SystemExit(f"failed: medattn {' '.join(argv)}")


def example_files(folder: Path) -> tuple[Path, Path]:
    """A positive test phantom of each image task, as the files a user would pass to explain."""
    folder.mkdir(parents=True, exist_ok=True)
    cxr = next(s for i in range(64) if (s := synthetic_cxr.make_sample(64, 0, "test", i))["label"][0] == 1)
    png = folder / "cxr.png"
    Image.fromarray((cxr["input"][0].numpy() * 255).round().astype(np.uint8)).save(png)
    mri = next(s for i in range(64) if (s := synthetic_breast_mri.make_sample((32, 32, 16), 0, "test", i))["label"][0])
    nii = folder / "mri.nii.gz"
    nib.save(nib.Nifti1Image(mri["input"][0].numpy().astype(np.float32), np.eye(4)), nii)
    return png, nii


def main_script() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", default="reports/demo", help="the folder `medattn demo` wrote")
    parser.add_argument("--out", default="reports/heatmaps")
    args = parser.parse_args()
    out, work = Path(args.out), Path(args.out) / "work"
    png, nii = example_files(work / "files")
    runs = Path(args.demo) / "runs"
    run(["explain", str(runs / "synthetic_cxr_seqnorm"), str(png), "--out", str(work / "cxr"), "--overwrite"])
    run(["explain", str(runs / "synthetic_breast_mri_seqnorm"), str(nii), "--out", str(work / "mri"), "--overwrite"])
    slides = work / "slides"
    run(["wsi", "synthetic", str(slides), "--count", "12"])
    run(["wsi", "tile", str(slides), "--out", str(work / "tiles"), "--no-progress"])
    run(["wsi", "extract", str(slides), "--tiles", str(work / "tiles"), "--out", str(work / "features"),
         "--no-progress"])
    run(["train", "synthetic_slides", f"data.feature_dir={work / 'features'}",
         f"data.slide_table={slides / 'slide_table.csv'}", f"data.clinical_table={slides / 'clinical_table.csv'}",
         "--out", str(work / "slide_run"), "--overwrite", "--no-progress"])
    run(["explain", str(work / "slide_run"), str(work / "features" / "slide_000.h5"), "--slides", str(slides),
         "--out", str(work / "slide_maps"), "--overwrite"])
    for source, name in ((work / "cxr" / "cxr.png", "cxr.png"), (work / "mri" / "mri_preview.png", "mri_preview.png"),
                         (work / "slide_maps" / "slide_000.png", "slide_000.png")):
        shutil.copyfile(source, out / name)
    print(f"wrote {', '.join(str(out / n) for n in ('cxr.png', 'mri_preview.png', 'slide_000.png'))}")


if __name__ == "__main__":
    main_script()
