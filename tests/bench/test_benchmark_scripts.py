"""Every script in benchmarks/ still runs: the docs quote figures with the command that reproduces them, so a script
that stopped running (a renamed import, a changed config default) makes those figures unreproducible.

Each script that needs nothing but its arguments runs end to end at a toy size (seconds, SYNTHETIC inputs) and
prints its result line. The others (they read earlier runs' folders, train for minutes, or are run by another test)
are listed with the reason and answer ``--help``, so their imports resolve. A new script must join one of the two
lists.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

#: script -> (toy arguments, "{out}" for an output folder; a text its output must contain).
TOY_RUNS = {
    "allocator.py": (["--threads", "1"], "into an existing buffer"),
    "attention_output_scale.py": (["--seq-lens", "16", "64"], "N=64"),
    "bf16_core_gradients.py": (["--seeds", "0", "--resolution", "32", "--batch", "1"], "gradient relative error"),
    "bf16_cosine.py": (["--encoders", "resnet50", "--tiles", "1", "--threads", "1"], "smallest cosine bf16 vs fp32"),
    "bf16_step_casts.py": (["--resolutions", "64", "--mechanisms", "seqnorm", "--out", "{out}"],
                           "forward_parameter_casts"),
    "binary_layer_parts.py": (["--tokens", "256", "--rounds", "1", "--threads", "1"], "output projection"),
    "binary_pixel_training.py": (["--steps", "2", "--size", "8", "--dim", "16", "--depth", "1"], "binary-bernoulli"),
    "extract_overlap.py": (["--encoders", "resnet50", "--side", "768", "--rounds", "1", "--threads", "1",
                            "--out", "{out}"], "'overlap_saved'"),
    "independent_survival.py": (["--write", "16", "4", "10", "--out", "{out}"], "test C-index"),
    "module_walk.py": (["--out", "{out}/walk.json", "--", "models"], "package changes"),
    "pam_cpu_seconds.py": (["1000", "1"], "cpu_s_per_1M"),
    "pam_segmentation_training.py": (["--model-pair", "unet", "--seeds", "0", "--steps", "2", "--train-size", "2",
                                      "--val-size", "2", "--threads", "1"], "mean upamnet"),
    "readout_questions.py": (["--out", "{out}/readout_questions.png"], "attention  200 tiles: r"),
    "real_size_bags.py": (["--tiles", "100", "--models", "seqnorm", "--phases", "train", "--repeats", "1",
                           "--threads", "1", "--out", "{out}"], "'phase': 'train'"),
    "residual_branch_scale.py": (["--preset", "vit2d_tiny", "--batch", "4", "--mechanisms", "seqnorm"],
                                 "stream after each block"),
    "step_profile.py": (["seqnorm", "64", "--model", "vit2d_small"], "linear-layer GEMMs"),
    "validation_cost.py": (["--images", "24", "--volumes", "12", "--repeats", "1", "--out", "{out}"], "volume_table"),
    "wsi_heatmap_mass.py": (["--slides", "12", "--epochs", "2", "--threads", "1", "--out", "{out}"],
                            "vitwsi_small (seqnorm)"),
    "wsi_million_tokens.py": (["--tokens", "2000", "--check-tokens", "1000", "--out", "{out}"],
                              "max_abs_difference_streamed_vs_unchunked"),
}

#: Toy runs of more than 10 s (1 thread): in ``make bench-smoke`` and ``make test-slow``, not ``make test``.
SLOW = {"independent_survival.py", "validation_cost.py", "wsi_heatmap_mass.py"}

#: script -> why it is only asked for --help here.
HELP_ONLY = {
    "bag_learning_dynamics.py": "trains on a realistic bag task folder (medattn realistic; minutes per readout)",
    "family_table.py": "reads the compare folders of the realistic family (hours of runs)",
    "bag_statistics_probe.py": "reads a realistic ihc_bags folder (medattn realistic, a minute to write)",
    "paired_arms.py": "reads the run folders of two finished experiments",
    "split_luck.py": "refits the pooled model over re-splits of a realistic bag task folder (medattn realistic)",
    "diffusion_scaling.py": "run at a toy size by tests/diffusion/test_diffusion_bench.py",
    "explain_sanity.py": "reads finished training runs",
    "heatmap_examples.py": "reads the folder a `medattn demo` wrote",
    "label_efficiency.py": "trains two arms per size and seed on a realistic image task (hours)",
    "kernel_targets.py": "reads GPU bench results; run on rows it writes by tests/bench/test_kernel_targets.py",
    "realistic_reference.py": "trains on a realistic task folder (minutes per seed)",
    "realistic_table.py": "reads a realistic task folder and a compare folder",
    "rejudge_runs.py": "rewrites finished run folders",
    "survival_loss_table.py": "reads the run folders of the survival loss arms (minutes per run)",
    "vit_seg_mechanisms.py": "trains a segmentation ViT per mechanism (minutes)",
}


def _run(script: str, arguments: list[str], folder: Path) -> subprocess.CompletedProcess:
    """The script run from ``folder`` (a file it writes by default lands there, not in the checkout)."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *arguments], capture_output=True, text=True,
                          timeout=300, env=environment, cwd=folder)


def test_every_script_is_run_or_says_why_not():
    scripts = {path.name for path in BENCHMARKS.glob("*.py")}
    assert scripts == set(TOY_RUNS) | set(HELP_ONLY)
    assert not set(TOY_RUNS) & set(HELP_ONLY) and SLOW <= set(TOY_RUNS)


@pytest.mark.parametrize("script", sorted(HELP_ONLY))
def test_script_answers_help(script, monkeypatch, capsys):
    """The script's code run as ``__main__`` in this process with ``--help`` (a fresh interpreter would spend
    seconds importing torch again for each script); an import that no longer resolves fails here as there. The
    scripts' folder leads ``sys.path``, as Python puts a script's folder there (a script imports its neighbours)."""
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / script), "--help"])
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")


@pytest.mark.parametrize("script", [pytest.param(script, marks=[pytest.mark.slow] if script in SLOW else [])
                                    for script in sorted(TOY_RUNS)])
def test_script_runs_at_a_toy_size(script, tmp_path):
    arguments, expected = TOY_RUNS[script]
    result = _run(script, [argument.replace("{out}", str(tmp_path / "out")) for argument in arguments], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert expected in result.stdout, result.stdout[-2000:]


@pytest.mark.parametrize("key", ["csv", "clinical_table"])
def test_label_efficiency_fine_tunes_the_pretrained_arm_alone(tmp_path, monkeypatch, key):
    """``--fine-tune`` overrides reach the pretrained arm's command and never the scratch arm's; both train on the
    same class-balanced subset of the table that lists the cases (an image table, a bag task's clinical table)."""
    import yaml

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import label_efficiency

    table = tmp_path / "task" / "cases.csv"
    table.parent.mkdir()
    rows = [f"case{i},{i % 2},{'train' if i < 8 else 'val'}" for i in range(10)]
    table.write_text("image,label,split\n" + "\n".join(rows) + "\n")
    (tmp_path / "task" / "config.yaml").write_text(yaml.safe_dump({"data": {key: str(table),
                                                                             "label_columns": "label"}}))
    commands = []
    monkeypatch.setattr(label_efficiency.subprocess, "run", lambda command, check: commands.append(command))
    for arm in label_efficiency.ARMS:
        label_efficiency.run(tmp_path / "task", tmp_path / "pre", tmp_path / "out", 4, 0, arm, ["train.epochs=1"],
                             ["train.layer_decay=0.75"])
    scratch, pretrained = commands
    assert "train.epochs=1" in scratch and "train.epochs=1" in pretrained
    assert "train.layer_decay=0.75" in pretrained and "train.layer_decay=0.75" not in scratch
    assert "--init-from" in pretrained and "--init-from" not in scratch
    subset_path = tmp_path / "out" / "tables" / "n4_s0.csv"
    for command in commands:
        assert f"data.{key}={subset_path}" in command
        assert (f"data.data_root={table.parent}" in command) == (key == "csv")
    subset = (tmp_path / "out" / "tables" / "n4_s0.csv").read_text().splitlines()
    assert sum(line.endswith(",train") for line in subset) == 4 and sum(line.endswith(",val") for line in subset) == 2
