"""Comparisons say what each arm is (issue 49): a finished arm is reused only when it started from the requested
checkpoint; an arm counts as pretrained only when its encoder loaded; the table, compare.csv and compare.json name
each arm's start; a folder's own summary files are not replaced."""

from __future__ import annotations

import csv
import json

import pytest

from engine_data import TINY
from medattn.config import load_config
from medattn.data import build_datasets
from medattn.errors import UserError
from medattn.experiments import compare as compare_module
from medattn.experiments.compare import arms_of, compare, initial_checkpoints, plot_arms
from medattn.outputs import OutputFolder
from medattn.pretrain import pretrain


def _pretrained(folder):
    """A one-epoch pretraining run of the TINY config's ViT."""
    config = load_config("synthetic_cxr", [*TINY, "pretrain.epochs=1", "pretrain.batch_size=8"])
    pretrain(config, build_datasets(config["data"], seed=config["seed"]), folder, progress=False, log=lambda m: None)
    return folder


def test_each_arm_names_its_start_and_a_finished_arm_is_reused_only_from_the_same_start(tmp_path):
    """`compare` rerun with another --init-from (or none) reused its finished arms and showed their old results; one
    ViT pretraining given to all arms recorded the ResNet arm as pretrained (only the head's bias had been copied)."""
    config = load_config("synthetic_cxr", TINY)
    pre = _pretrained(tmp_path / "pre")
    root = tmp_path / "cmp"
    lines = []
    summary = compare(config, ["seqnorm"], ["resnet2d_tiny"], [0], root, progress=False, log=lines.append,
                      init_from=pre)
    assert "arm resnet2d_tiny: starts from scratch (no checkpoint that fills its encoder)" in lines
    assert [(r["arm"], r["start"]) for r in summary["arms"]] == [("seqnorm", str(pre)), ("resnet2d_tiny", "scratch")]
    resnet = json.loads((root / "resnet2d_tiny/seed_0/results.json").read_text())
    vit = json.loads((root / "seqnorm/seed_0/results.json").read_text())
    assert resnet["init_from"] is None and vit["init_from"]["pretrained"]["objective"] == "masked autoencoding"
    rows = list(csv.DictReader(open(root / "compare.csv")))
    assert [(r["arm"], r["start"]) for r in rows] == [("seqnorm", str(pre)), ("resnet2d_tiny", "scratch")]
    assert [r["start"] for r in json.loads((root / "compare.json").read_text())["arms"]] == [str(pre), "scratch"]
    assert "start" in lines[-1] and str(pre) in lines[-1] and "scratch" in lines[-1]  # the printed table
    assert str(pre) in (root / "report.html").read_text()
    labels = [t.get_text() for t in plot_arms(summary, OutputFolder(tmp_path), "arms.png").get_xticklabels()]
    assert labels[0].endswith("\nfrom pre") and "from" not in labels[1]  # compare.png
    # the same request reuses every finished arm; another start is refused before anything runs
    lines.clear()
    compare(config, ["seqnorm"], ["resnet2d_tiny"], [0], root, progress=False, log=lines.append, init_from=pre)
    assert {"[1/2] seqnorm/seed_0: finished, skipped", "[2/2] resnet2d_tiny/seed_0: finished, skipped"} <= set(lines)
    before = (root / "compare.json").read_text()
    with pytest.raises(UserError, match=r"seqnorm/seed_0 holds a finished run that starts from .*pre, this one from "
                                        r"scratch \(no --init-from\)"):
        compare(config, ["seqnorm"], ["resnet2d_tiny"], [0], root, progress=False, log=lambda m: None)
    assert (root / "compare.json").read_text() == before


def test_one_checkpoint_for_all_arms_starts_only_the_arms_that_take_its_encoder(tmp_path):
    """A ViT checkpoint given to every arm: the ResNet arm starts from scratch; an arm's own checkpoint that does not
    fit it is refused."""
    config = load_config("synthetic_cxr", TINY)
    pre = _pretrained(tmp_path / "pre")
    arms = arms_of(config, ["seqnorm"], ["resnet2d_tiny"])
    assert initial_checkpoints(arms, pre) == {"seqnorm": str(pre), "resnet2d_tiny": None}
    (tmp_path / "per_arm").mkdir()
    (tmp_path / "per_arm" / "resnet2d_tiny").symlink_to(pre)
    with pytest.raises(UserError, match="arm resnet2d_tiny's model resnet2d_tiny cannot take its encoder"):
        initial_checkpoints(arms, tmp_path / "per_arm")


def test_compare_refuses_a_folder_holding_the_users_own_summary_files(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(compare_module, "run_jobs", never)
    (tmp_path / "report.html").write_text("the user's page")
    config = load_config("synthetic_cxr", TINY)
    with pytest.raises(UserError, match="report.html was not written by medattn compare: refusing to replace it"):
        compare(config, ["seqnorm"], [], [0], tmp_path, progress=False, log=lambda m: None)
    assert (tmp_path / "report.html").read_text() == "the user's page"
