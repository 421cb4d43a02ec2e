"""Where a bag task's label lives: logistic regression on one pooled statistic of the standardised tile features.

    python benchmarks/bag_statistics_probe.py bench/ihc_bags [--out probe.json]

For each statistic over a bag's tiles (mean, standard deviation, 95th and 98th percentile, maximum) every slide
becomes one vector (F values); a logistic regression (scikit-learn, features standardised, C in 0.01, 0.1, 1) is
fitted on the training slides and scored on the test slides (the task's split column). A finding in a few tiles
shows in the maximum and hardly in the mean or the spread: that is what a readout must reach. The SeqNorm class
token sees a bag only through per-channel means and variances of its projections and their normalised
cross-covariance (docs/decisions.md, "Bag readout"), i.e. the first two rows, never the maximum.
Reads a ``medattn realistic`` ihc_bags folder (slides.csv, clinical.csv, features/*.h5, CLAM layout).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

STATISTICS = {
    "mean": lambda x: x.mean(0),
    "std": lambda x: x.std(0),
    "q95": lambda x: np.quantile(x, 0.95, axis=0),
    "q98": lambda x: np.quantile(x, 0.98, axis=0),
    "max": lambda x: x.max(0),
}
STRENGTHS = (0.01, 0.1, 1.0)


def read_task(folder: Path) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, str]]]:
    """-> (slide -> features (N, F) float64, slide -> (label, split))."""
    import h5py

    clinical = {row["PATIENT"]: (int(row["label"]), row["split"]) for row in csv.DictReader(
        (folder / "clinical.csv").open())}
    bags, labels = {}, {}
    for row in csv.DictReader((folder / "slides.csv").open()):
        with h5py.File(folder / "features" / f"{row['FILENAME']}.h5") as f:
            bags[row["FILENAME"]] = f["features"][:].astype(np.float64)
        labels[row["FILENAME"]] = clinical[row["PATIENT"]]
    return bags, labels


def probe(bags: dict[str, np.ndarray], labels: dict[str, tuple[int, str]]) -> dict[str, dict[str, float]]:
    """statistic -> {C: test AUROC} of the logistic regression on that statistic."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import StandardScaler

    train = [s for s in bags if labels[s][1] == "train"]
    test = [s for s in bags if labels[s][1] == "test"]
    tiles = np.concatenate([bags[s] for s in train])
    mean, std = tiles.mean(0), tiles.std(0)
    std[std < 1e-6] = 1.0  # as medattn's FeatureStandardizer
    out = {}
    for name, statistic in STATISTICS.items():
        x_train = np.stack([statistic((bags[s] - mean) / std) for s in train])
        x_test = np.stack([statistic((bags[s] - mean) / std) for s in test])
        scaler = StandardScaler().fit(x_train)
        out[name] = {}
        for strength in STRENGTHS:
            model = LogisticRegression(C=strength, max_iter=5000).fit(scaler.transform(x_train),
                                                                       [labels[s][0] for s in train])
            scores = model.predict_proba(scaler.transform(x_test))[:, 1]
            out[name][str(strength)] = float(roc_auc_score([labels[s][0] for s in test], scores))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", type=Path, help="a medattn realistic ihc_bags folder")
    parser.add_argument("--out", type=Path, help="write the AUROCs as JSON here")
    args = parser.parse_args()
    result = probe(*read_task(args.task))
    for name, by_strength in result.items():
        print(f"{name:5s} " + "  ".join(f"C={c}: {auc:.3f}" for c, auc in by_strength.items()))
    if args.out:
        args.out.write_text(json.dumps({"task": str(args.task), "test_auroc": result}, indent=1))


if __name__ == "__main__":
    main()
