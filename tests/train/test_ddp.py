"""Two CPU processes (gloo) launched by torchrun train one model; predictions are gathered from both ranks."""

import csv
import os
import subprocess
import sys

from medattn.cli import main

TINY = ["data.kind=synthetic_cxr", "data.image_size=32", "data.num_samples=[16, 9, 9]", "model.name=vit2d_tiny",
        "train.epochs=1", "train.batch_size=4", "train.threads=1", "eval.bootstrap=20"]


def test_two_process_ddp_gathers_every_sample_once(tmp_path):
    run_dir = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "medattn", "train", "synthetic_cxr", *TINY, "--out", str(run_dir), "--no-progress"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("test AUROC") == 1  # only rank 0 reports
    ddp_rows = list(csv.DictReader(open(run_dir / "predictions_test.csv")))
    # 9 test samples over 2 ranks: the sampler pads one rank with a repeat, the gather drops it
    assert [r["id"] for r in ddp_rows] == [f"synthetic_cxr-test-{i:06d}" for i in range(9)]
    assert main(["eval", str(run_dir), "synthetic_cxr", *TINY, "--out", str(tmp_path / "single"),
                 "--no-progress"]) == 0
    single_rows = list(csv.DictReader(open(tmp_path / "single/predictions_test.csv")))
    assert [float(r["prob_cardiomegaly"]) for r in single_rows] == \
           [float(r["prob_cardiomegaly"]) for r in ddp_rows]
