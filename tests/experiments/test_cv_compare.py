"""medattn cv and medattn compare: patient-level folds, resumable runs, aggregation and paired tests."""

import csv
import json
import math

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.metrics import roc_auc_score

from medattn import metrics
from medattn.cli import main
from medattn.config import load_config
from medattn.data import build_datasets
from medattn.data.base import DataBundle, TaskInfo
from medattn.data.cohort.folds import pooled_folds
from medattn.data.seeded import SyntheticDataset
from medattn.errors import UserError
from medattn.experiments import cv
from medattn.experiments.compare import arms_of, compare, summarise
from medattn.experiments.runs import read_cases
from medattn.train import loop

TINY_SEG = ["data.volume_size=[8,8,40]", "data.num_samples=[6,2,2]", "model.name=unet3d", "train.epochs=1",
            "eval.bootstrap=0", "eval.heatmaps=0", "train.batch_size=2"]


def ids(dataset) -> list[str]:
    return [dataset[i]["id"] for i in range(len(dataset))]


def test_folds_are_patient_level_and_test_every_patient_once():
    def make(split, i):  # two cases per patient, some across the generator's splits
        return {"input": torch.zeros(1, 2, 2), "label": torch.tensor([float(i % 2)]), "id": f"{split}-{i}",
                "patient": f"p{(i + (0 if split == 'train' else 20)) // 2}"}

    parts = [SyntheticDataset(n, lambda i, s=s: make(s, i)) for s, n in (("train", 20), ("val", 6), ("test", 6))]
    bundle = DataBundle(*parts, task=TaskInfo("binary", "image2d", 1, (1, 2, 2)))
    patient_of = {f"{s}-{i}": make(s, i)["patient"] for s, n in (("train", 20), ("val", 6), ("test", 6))
                  for i in range(n)}
    tested = []
    for fold in range(4):
        split = pooled_folds(bundle, {"folds": 4, "fold": fold}, seed=3, kind="fake")
        members = {name: {patient_of[i] for i in ids(part)} for name, part in
                   zip(("train", "val", "test"), (split.train, split.val, split.test))}
        assert not (members["train"] & members["val"] or members["train"] & members["test"]
                    or members["val"] & members["test"])
        assert sum(len(p) for p in (split.train, split.val, split.test)) == 32
        tested += sorted(members["test"])
    assert sorted(tested) == sorted(set(patient_of.values()))  # every patient tested exactly once


def test_synthetic_folds_through_build_datasets_and_bad_fold_settings():
    cfg = {"kind": "synthetic_vertebrae", "volume_size": [8, 8, 40], "num_samples": [6, 2, 2], "folds": 5}
    tested = [i for fold in range(5) for i in ids(build_datasets({**cfg, "fold": fold}).test)]
    assert len(tested) == len(set(tested)) == 10
    with pytest.raises(UserError, match="folds must be an int from 2 to the number of patients \\(10\\)"):
        build_datasets({**cfg, "folds": 11, "fold": 0})
    with pytest.raises(UserError, match="not test_fraction"):
        build_datasets({**cfg, "fold": 0, "test_fraction": 0.2})
    with pytest.raises(UserError, match="does not take fold"):
        build_datasets({"kind": "synthetic_vertebrae", "fold": 1})


def test_cv_resumes_and_aggregates_the_folds_results(tmp_path, monkeypatch):
    config = load_config("synthetic_vertebrae", TINY_SEG)
    lines = []
    summary = cv.cross_validate(config, 2, tmp_path, progress=False, log=lines.append)
    results = [json.loads((tmp_path / f"fold_{k}" / "results.json").read_text()) for k in range(2)]
    # by hand from the folds' results.json: mean and sample std over folds
    overall = [r["test"]["dice"] for r in results]
    row = summary["rows"][0]
    assert row["structure"] == "overall" and row["per_fold"] == overall
    assert row["mean"] == pytest.approx(np.mean(overall)) and row["std"] == pytest.approx(np.std(overall, ddof=1))
    for row in summary["rows"][1:]:
        values = [r["test"]["dice_per_class"][row["structure"]] for r in results]
        defined = [v for v in values if v is not None]
        assert row["per_fold"] == values and row["mean"] == pytest.approx(np.mean(defined))
    assert [r["structure"] for r in summary["rows"]] == ["overall", "blob1", "blob2", "blob3", "blob4"]
    with open(tmp_path / "cv.csv") as f:
        table = list(csv.DictReader(f))
    assert float(table[0]["mean"]) == pytest.approx(np.mean(overall))
    assert json.loads((tmp_path / "cv.json").read_text())["rows"][0]["per_fold"] == overall
    assert "mean (std)" in lines[-1] and "[SYNTHETIC data]" in lines[-1]

    # finished folds are skipped (fit is never called); a fold killed before its test resumes
    calls = []
    fit = loop.fit
    monkeypatch.setattr(loop, "fit", lambda *a, **k: calls.append(k) or fit(*a, **k))
    lines.clear()
    again = cv.cross_validate(config, 2, tmp_path, progress=False, log=lines.append)
    assert calls == [] and again["rows"] == summary["rows"]
    assert lines[:2] == ["[1/2] fold_0: finished, skipped", "[2/2] fold_1: finished, skipped"]
    (tmp_path / "fold_1" / "results.json").unlink()
    lines.clear()
    cv.cross_validate(config, 2, tmp_path, progress=False, log=lines.append)
    assert [k["resume"] for k in calls] == [True] and "[2/2] fold_1: resuming" in lines
    # a finished fold with another config is not silently reused
    changed = load_config("synthetic_vertebrae", [*TINY_SEG, "train.lr=0.5"])
    with pytest.raises(UserError, match="config differs in train.lr"):
        cv.cross_validate(changed, 2, tmp_path, progress=False, log=lines.append)


def test_cv_bad_input(tmp_path):
    config = load_config("synthetic_vertebrae", TINY_SEG)
    with pytest.raises(UserError, match="number of patients \\(10\\)"):
        cv.cross_validate(config, 11, tmp_path / "a", progress=False, log=lambda m: None)
    assert not list((tmp_path / "a").glob("fold_*/results.json"))
    with pytest.raises(UserError, match="--folds must be an int >= 2"):
        cv.fold_jobs(config, 1)
    preset = load_config("synthetic_vertebrae", [*TINY_SEG, "data.folds=3"])
    with pytest.raises(UserError, match="the config sets data.folds"):
        cv.fold_jobs(preset, 2)


def write_run(folder, probs, labels, metric_value):
    folder.mkdir(parents=True)
    with open(folder / "predictions_test.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "patient", "label_positive", "prob_positive"])
        for i, (p, y) in enumerate(zip(probs, labels)):
            writer.writerow([f"case{i}", f"patient{i // 2}", int(y), f"{p:.6f}"])
    return {"metric": "auroc", "test": {"auroc": metric_value}, "data": "fake", "synthetic": True}


def test_compare_statistics_match_a_hand_computation(tmp_path):
    config = load_config("synthetic_cxr", ["eval.bootstrap=60"])
    arms = arms_of(config, ["softmax", "seqnorm"], [])
    seeds = [0, 1, 2]
    rng = np.random.default_rng(7)
    cases, results = {}, []
    for arm, skill in (("softmax", 0.8), ("seqnorm", 1.5)):
        for seed in seeds:
            labels = np.arange(40) % 2
            probs = 1 / (1 + np.exp(-(skill * (2 * labels - 1) + rng.normal(size=40))))
            probs = np.round(probs, 6)
            cases[arm, seed] = (probs, labels)
            results.append(write_run(tmp_path / arm / f"seed_{seed}", probs, labels, roc_auc_score(labels, probs)))
    summary = summarise(arms, seeds, results, tmp_path)
    ref = [roc_auc_score(cases["softmax", s][1], cases["softmax", s][0]) for s in seeds]
    new = [roc_auc_score(cases["seqnorm", s][1], cases["seqnorm", s][0]) for s in seeds]
    row = summary["arms"][1]
    assert row["mean"] == pytest.approx(np.mean(new)) and row["std"] == pytest.approx(np.std(new, ddof=1))
    t_row, boot = summary["tests"]
    d = np.subtract(new, ref)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(3))
    assert t_row["statistic"] == pytest.approx(t) and t_row["p_value"] == pytest.approx(2 * stats.t.sf(abs(t), 2))
    # the paired bootstrap by hand: patients (two cases each) resampled within each seed, both arms together
    gen = np.random.default_rng(config["seed"])
    draws = []
    while len(draws) < 60:
        diffs = []
        for s in seeds:
            patients = gen.integers(0, 20, 20)
            index = np.concatenate([[2 * p, 2 * p + 1] for p in patients])
            (pa, ya), (pb, yb) = cases["softmax", s], cases["seqnorm", s]
            diffs.append(roc_auc_score(yb[index], pb[index]) - roc_auc_score(ya[index], pa[index]))
        draws.append(np.mean(diffs))
    draws = np.array(draws)
    assert boot["difference"] == pytest.approx(np.mean(d))
    assert [boot["ci_low"], boot["ci_high"]] == pytest.approx(list(np.quantile(draws, [0.025, 0.975])))
    p = min(1, 2 * min((1 + (draws <= 0).sum()) / 61, (1 + (draws >= 0).sum()) / 61))
    assert boot["p_value"] == pytest.approx(p) and boot["n_cases"] == 120
    assert read_cases(tmp_path / "seqnorm" / "seed_0").task_type == "binary"


def test_paired_bootstrap_of_identical_systems_finds_no_difference():
    result = metrics.paired_bootstrap(lambda index: 0.0 * sum(len(i) for i in index), [["a", "b", "c"]], 100)
    assert result["difference"] == 0 and result["ci_low"] == result["ci_high"] == 0 and result["p_value"] == 1


def test_compare_bad_input(tmp_path):
    config = load_config("synthetic_cxr", ["eval.bootstrap=0"])
    with pytest.raises(UserError, match="unknown attention 'nonsense'"):
        compare(config, ["softmax", "nonsense"], [], [0], tmp_path, progress=False, log=lambda m: None)
    assert not (tmp_path / "softmax").exists()  # checked before the first run
    with pytest.raises(UserError, match="unknown model"):
        arms_of(config, [], ["no_such_model"])
    with pytest.raises(UserError, match="given twice"):
        arms_of(config, ["softmax", "softmax"], [])
    with pytest.raises(UserError, match="give the arms"):
        arms_of(config, [], [])
    with pytest.raises(UserError, match="--reference 'sima'"):
        compare(config, ["softmax"], [], [0], tmp_path, reference="sima", progress=False)
    assert arms_of(config, [], ["resnet2d_tiny"])["resnet2d_tiny"]["model"]["attention"] is None


def test_compare_names_the_config_values_that_replace_a_models_own_settings(tmp_path):
    """A weight decay written for the ViT arm reaches the attention-MIL arm as the same (decoupled) AdamW decay,
    and the table says it replaced that model's own; values equal to a model's own are not listed."""
    from medattn.experiments.compare import format_summary, replaced_settings
    from medattn.train.defaults import training_defaults

    config = load_config("synthetic_wsi", ["train.weight_decay=0.05", "train.warmup_epochs=1", "train.lr=2e-4"])
    arms = arms_of(config, ["seqnorm"], ["abmil_tiny"])
    replaced = replaced_settings(config, arms)
    assert training_defaults("abmil_tiny")["optimizer"] == "adamw"  # the decay stays decoupled in every arm
    assert replaced["abmil_tiny"]["train.weight_decay"] == {"user": 0.05, "own": 1e-4}
    assert replaced["abmil_tiny"]["train.warmup_epochs"] == {"user": 1, "own": 0.0}
    assert "train.lr" not in replaced["abmil_tiny"]  # 2e-4 is its own rate
    assert replaced["seqnorm"]["train.weight_decay"] == {"user": 0.05, "own": 1e-4}  # vitwsi_small: MIL's too
    results = [write_run(tmp_path / arm / "seed_0", np.array([0.2, 0.8] * 10), np.arange(20) % 2, 1.0)
               for arm in arms]
    summary = summarise(arms, [0], results, tmp_path, config=config)
    assert summary["arms"][1]["user_settings"] == replaced["abmil_tiny"]
    assert "train.weight_decay 0.05 (own 0.0001), train.warmup_epochs 1 (own 0)" in format_summary(summary)


def test_compare_starts_each_arm_from_its_own_pretraining_or_one_checkpoint(tmp_path):
    from medattn.experiments.compare import compare_jobs, initial_checkpoints

    config = load_config("synthetic_cxr")
    arms = arms_of(config, ["softmax", "seqnorm"], ["resnet2d_tiny"])
    for arm in ("softmax", "seqnorm"):
        (tmp_path / "per_arm" / arm).mkdir(parents=True)
    starts = initial_checkpoints(arms, tmp_path / "per_arm")
    per_arm = tmp_path / "per_arm"
    assert starts == {"softmax": str(per_arm / "softmax"), "seqnorm": str(per_arm / "seqnorm"), "resnet2d_tiny": None}
    assert [job.init_from for job in compare_jobs(arms, [0, 1], starts)][:2] == [starts["softmax"]] * 2
    weights = tmp_path / "vit.safetensors"
    weights.write_bytes(b"")
    assert set(initial_checkpoints(arms, weights).values()) == {str(weights)}
    assert initial_checkpoints(arms, None) == dict.fromkeys(arms)
    with pytest.raises(UserError, match="neither a checkpoint"):
        initial_checkpoints(arms, tmp_path / "per_arm" / "softmax")
    with pytest.raises(UserError, match="no such file"):
        initial_checkpoints(arms, tmp_path / "nothing")


def test_a_baseline_arm_keeps_only_the_model_kwargs_its_preset_takes(capsys):
    """A ViT's patch_size cannot reach a ResNet arm (it would refuse it); a shared argument (drop_rate) does."""
    config = load_config("synthetic_breast_mri", ["model.kwargs.patch_size=[4, 4, 4]", "model.kwargs.drop_rate=0.1"])
    arms = arms_of(config, ["seqnorm"], ["resnet3d_tiny"])
    assert arms["seqnorm"]["model"]["kwargs"] == {"patch_size": [4, 4, 4], "drop_rate": 0.1}
    assert arms["resnet3d_tiny"]["model"]["kwargs"] == {"drop_rate": 0.1}
    assert main(["compare", "synthetic_breast_mri", "model.kwargs.patch_size=[4, 4, 4]", "--attention", "seqnorm",
                 "--models", "resnet3d_tiny", "--reference", "nope", "--out", "/nonexistent/x"]) == 2
    assert ("arm resnet3d_tiny: model.kwargs patch_size left out (its model 'resnet3d_tiny' takes no such argument)"
            in capsys.readouterr().out)


def test_command_lines(capsys):
    # key=value after --attention/--seeds is an override, not an arm or a seed
    assert main(["compare", "synthetic_cxr", "--attention", "softmax", "nonsense", "--seeds", "0",
                 "eval.bootstrap=0", "--out", "/nonexistent/x"]) == 2
    assert "unknown attention 'nonsense'" in capsys.readouterr().err
    assert main(["compare", "synthetic_cxr", "--attention", "softmax", "--seeds", "zero"]) == 2
    assert "--seeds takes non-negative ints" in capsys.readouterr().err
    assert main(["cv", "synthetic_cxr", "--folds", "1"]) == 2
    assert "--folds must be an int >= 2" in capsys.readouterr().err


def test_compare_draws_each_arm_per_seed_and_marks_arms_that_did_not_learn(tmp_path):
    from medattn.experiments.compare import plot_arms
    from medattn.outputs import OutputFolder

    summary = {"metric": "auroc", "data": "d", "synthetic": True, "seeds": [0, 1], "arms": [
        {"arm": "softmax", "per_seed": [0.8, 0.9], "mean": 0.85, "status": "learned"},
        {"arm": "seqnorm", "per_seed": [0.5, 0.52], "mean": 0.51, "status": "DID NOT LEARN (seed 0, 1)"}]}
    axis = plot_arms(summary, OutputFolder(tmp_path))
    labels = [tick.get_text() for tick in axis.get_xticklabels()]
    assert labels == ["softmax", "seqnorm\n(did not learn)"] and (tmp_path / "compare.png").stat().st_size > 0
    assert [round(bar.get_height(), 2) for bar in axis.patches] == [0.85, 0.51]
    assert axis.patches[1].get_hatch() == "//" and not axis.patches[0].get_hatch()


@pytest.mark.parametrize("risks", [["risk"], ["risk_cancer", "risk_other"]])
def test_survival_predictions_are_read_beside_their_risk_group(tmp_path, risks):
    """A survival or competing-risks run's predictions_test.csv holds a text column, risk_group, beside the risks:
    compare reads the risks and scores the C-index (it failed on 'low' before)."""
    from medattn.metrics_competing import cause_specific_c_index
    from medattn.metrics_survival import concordance_index

    rng = np.random.default_rng(0)
    n = 30
    time, risk = rng.uniform(1, 50, n), rng.normal(size=(n, len(risks)))
    event = rng.integers(0, len(risks) + 1, n) if len(risks) > 1 else rng.integers(0, 2, n)
    with open(tmp_path / "predictions_test.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "patient", "time", "event", *risks, "risk_group"])
        for i in range(n):
            writer.writerow([f"c{i}", f"p{i}", f"{time[i]:.4f}", event[i], *[f"{r:.6f}" for r in risk[i]],
                             "high" if risk[i, 0] > 0 else "low"])
    cases = read_cases(tmp_path)
    assert cases.outputs.shape == (n, len(risks)) and cases.labels.shape == (n, 2)
    everyone = np.arange(n)
    rounded = np.round(risk[:, 0], 6)
    expected = (concordance_index(rounded, np.round(time, 4), event.astype(bool)) if len(risks) == 1
                else cause_specific_c_index(rounded, np.round(time, 4), event, 1))
    assert cases.score(everyone) == pytest.approx(expected)
