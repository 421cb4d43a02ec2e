import csv
import errno
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine_data import image_bundle, tiny_config
from medattn.config import DEFAULTS
from medattn.data.base import TaskInfo
from medattn.errors import UserError
from medattn.models import create_model
from medattn.runtime import checkpoint
from medattn.runtime.trained import load_checkpoint
from medattn.train import fit
from medattn.train.rundir import RUN_FILES


class Killed(Exception):
    """Stands in for the process dying right after an epoch's checkpoint was written."""


def _fit(config, run_dir, **kwargs):
    return fit(config, image_bundle(), run_dir, progress=False, log=lambda m: None, **kwargs)


def _meta(**extra) -> dict:
    """A valid checkpoint.json for a tiny ViT on (1, 32, 32) images."""
    task = TaskInfo("binary", "image2d", 1, (1, 32, 32))
    return {"config": tiny_config(), "task": checkpoint.task_to_dict(task), **extra}


def _snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and p.name != ".lock"}


def _kill_after(epoch):
    def hook(done, row):
        if done == epoch:
            raise Killed

    return hook


def _fit_in_a_fresh_process(run_dir, *overrides) -> subprocess.Popen:
    """Start ``_fit`` in a new Python process: its first run there, Numba's threading layer not yet started
    (``NUMBA_NUM_THREADS=2``: starting it once reset the OpenMP thread count under torch's); it writes
    ``run_dir``."""
    script = ("import sys\nsys.path.insert(0, sys.argv[1])\nfrom engine_data import image_bundle, tiny_config\n"
              "from medattn.train import fit\n"
              "fit(tiny_config(*sys.argv[3:]), image_bundle(), sys.argv[2], progress=False, log=lambda m: None)\n")
    env = {**os.environ, "NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"}
    tests = os.path.dirname(os.path.dirname(__file__))
    return subprocess.Popen([sys.executable, "-c", script, tests, str(run_dir), *overrides], env=env)


def test_resume_gives_the_same_final_metrics_as_an_uninterrupted_run(tmp_path):
    """The uninterrupted run is its process's first; the interrupted and resumed ones run in this process, after
    other tests' runs or (the test alone) the interrupted one first: what a process sets up on first use must not
    change the numbers."""
    overrides = ("train.epochs=3", "train.grad_accum=2")
    config = tiny_config(*overrides)
    uninterrupted = _fit_in_a_fresh_process(tmp_path / "full", *overrides)  # meanwhile, the interrupted run here
    try:
        with pytest.raises(Killed):
            _fit(config, tmp_path / "resumed", on_epoch_end=_kill_after(1))
        resumed = json.loads(json.dumps(_fit(config, tmp_path / "resumed", resume=True)))
    finally:
        uninterrupted.wait(timeout=300)
    assert uninterrupted.returncode == 0
    full = json.loads((tmp_path / "full/results.json").read_text())
    assert resumed["test"] == full["test"]
    assert resumed["best_epoch"] == full["best_epoch"] and resumed["val_auroc"] == full["val_auroc"]
    rows = [list(csv.DictReader(open(tmp_path / run / "metrics.csv"))) for run in ("full", "resumed")]
    assert [{k: r[k] for k in ("epoch", "lr", "train_loss", "val_auroc")} for r in rows[0]] == \
           [{k: r[k] for k in ("epoch", "lr", "train_loss", "val_auroc")} for r in rows[1]]
    full_w = load_file(tmp_path / "full/checkpoints/last/model.safetensors")
    resumed_w = load_file(tmp_path / "resumed/checkpoints/last/model.safetensors")
    assert all(torch.equal(full_w[k], resumed_w[k]) for k in full_w)


def test_output_folder_with_a_run_is_refused(tmp_path):
    config = tiny_config("train.epochs=1")
    _fit(config, tmp_path / "run")
    with pytest.raises(UserError, match="already holds a run; use --resume"):
        _fit(config, tmp_path / "run")
    _fit(config, tmp_path / "run", overwrite=True)
    with pytest.raises(UserError, match="differs from the run's saved config in train.lr"):
        _fit(tiny_config("train.epochs=1", "train.lr=0.5"), tmp_path / "run", resume=True)
    with pytest.raises(UserError, match="no checkpoint to resume"):
        _fit(config, tmp_path / "empty", resume=True)


def test_init_from_another_mechanism_reports_new_tensors(tmp_path):
    _fit(tiny_config("train.epochs=1"), tmp_path / "softmax")
    results = _fit(tiny_config("train.epochs=1", "model.attention=seqnorm"), tmp_path / "seqnorm",
                   init_from=tmp_path / "softmax")
    new = results["init_from"]["new_tensors"]
    assert new and all("norm" in name and ".attn." in name for name in new)
    model = create_model("vit2d_tiny", attention="seqnorm", num_classes=1)
    fresh, unused = checkpoint.init_from(model, checkpoint.resolve(tmp_path / "softmax"))
    assert fresh == new and unused == []
    source = load_file(tmp_path / "softmax/checkpoints/best/model.safetensors")
    assert torch.equal(model.state_dict()["encoder.blocks.0.attn.qkv.weight"],
                       source["encoder.blocks.0.attn.qkv.weight"])


def test_atomic_write_keeps_the_previous_checkpoint(tmp_path):
    model = torch.nn.Linear(2, 1)
    checkpoint.save(tmp_path / "ck", model, _meta(epoch=1))
    with pytest.raises(RuntimeError):
        with checkpoint.atomic_dir(tmp_path / "ck") as tmp:
            (tmp / "model.safetensors").write_text("half written")
            raise RuntimeError("killed while writing")
    assert checkpoint.load_meta(checkpoint.resolve(tmp_path / "ck"))["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_corrupt_or_missing_checkpoint_is_a_user_error(tmp_path):
    model = torch.nn.Linear(2, 1)
    checkpoint.save(tmp_path / "ck", model, _meta())
    (tmp_path / "ck/model.safetensors").write_bytes(b"\x80\x04not safetensors")
    with pytest.raises(UserError, match="unreadable weights"):
        checkpoint.load_model(tmp_path / "ck", model)
    with pytest.raises(UserError, match="no checkpoint found"):
        checkpoint.resolve(tmp_path / "nothing")


def test_optimizer_and_rng_state_round_trip(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    checkpoint.save(tmp_path / "ck", model, _meta(), optimizer, {"epoch": 3})
    expected = torch.rand(5)
    other = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=0.5)
    state = checkpoint.load_training_state(tmp_path / "ck", other)
    assert state["epoch"] == 3 and torch.equal(torch.rand(5), expected)
    for a, b in zip(optimizer.state_dict()["state"].values(), other.state_dict()["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert other.param_groups[0]["lr"] == 0.1


def test_disk_full_is_one_line_naming_the_folder_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = torch.nn.Linear(2, 1)
    checkpoint.save(tmp_path / "ck", model, _meta(epoch=1))
    before = _snapshot(tmp_path)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint, "save_file", full)
    with pytest.raises(UserError, match=rf"^cannot write {tmp_path / 'ck'}: No space left on device$"):
        checkpoint.save(tmp_path / "ck", model, _meta(epoch=2))
    assert _snapshot(tmp_path) == before


def test_stale_tmp_and_old_folders_are_cleaned_up(tmp_path):
    folder = tmp_path / "checkpoints"
    for name in (".last.tmp-123", ".best.tmp-9", "last", "last.old", "best.old", "notes.tmp-1", ".keep"):
        (folder / name).mkdir(parents=True)
    (folder / "best.old" / "checkpoint.json").write_text("{}")
    checkpoint.clean_stale(folder)
    # tmp folders gone; last.old dropped (last exists); best.old renamed back to best; foreign names kept
    assert sorted(p.name for p in folder.iterdir()) == [".keep", "best", "last", "notes.tmp-1"]
    assert (folder / "best" / "checkpoint.json").exists()


def test_resume_after_a_crash_removes_unfinished_checkpoint_writes(tmp_path):
    config = tiny_config("train.epochs=2")
    with pytest.raises(Killed):
        _fit(config, tmp_path / "run", on_epoch_end=_kill_after(1))
    stale = tmp_path / "run/checkpoints/.last.tmp-99999"
    stale.mkdir()
    (stale / "model.safetensors").write_text("half written")
    _fit(config, tmp_path / "run", resume=True)
    assert sorted(p.name for p in (tmp_path / "run/checkpoints").iterdir()) == ["best", "last"]


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("task"), "must be a mapping with 'config' and 'task'"),
    (lambda m: m["task"].update(num_outputs="1"), r"task.num_outputs is missing or invalid \(got '1'\)"),
    (lambda m: m["task"].update(input_shape=[1, 10**6, 10**6]), "task.input_shape is missing or invalid"),
    (lambda m: m["task"].update(task_type="ranking"), "task.task_type"),
    (lambda m: m["task"].update(evil=1), r"task has unknown keys \['evil'\]"),
    (lambda m: m["config"]["model"]["kwargs"].update(depth=10**9), "config.model.kwargs.depth is 1000000000"),
    (lambda m: m["config"]["model"]["kwargs"].update(embed_dim=10**7), "config.model.kwargs.embed_dim is 10000000"),
    (lambda m: m["config"]["model"]["kwargs"].update(dilations=list(range(5000))), "a list of 5000 items"),
    (lambda m: m["config"]["train"].update(lr=-1), "config: train.lr must be"),
    (lambda m: m.update(config=[]), "must be a mapping"),
])
def test_checkpoint_json_is_checked_against_its_schema(tmp_path, edit, message):
    meta = _meta()
    edit(meta)
    (tmp_path / "checkpoint.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=message) as error:
        checkpoint.load_meta(tmp_path)
    assert str(error.value).startswith(str(tmp_path / "checkpoint.json")) and "\n" not in str(error.value)


def test_weights_are_checked_against_the_model_before_any_is_read(tmp_path, monkeypatch):
    config = tiny_config("train.epochs=1")
    _fit(config, tmp_path / "run")
    best = tmp_path / "run/checkpoints/best"
    weights = load_file(best / "model.safetensors")
    model = create_model("vit2d_tiny", num_classes=1)
    read = []
    monkeypatch.setattr(checkpoint, "load_file", lambda *a, **k: read.append(a) or {})
    cases = {
        "head.weight": (lambda w: w.update({"head.weight": w["head.weight"][:, :-1].contiguous()}),
                        "tensor head.weight has shape [1, 31], the model expects [1, 32]"),
        "missing": (lambda w: w.pop("encoder.norm.bias"), "the model's tensor encoder.norm.bias [32] is missing"),
        "unexpected": (lambda w: w.update({"extra.weight": torch.zeros(2)}), "tensor extra.weight is not part of"),
    }
    for edit, message in cases.values():
        edited = dict(weights)
        edit(edited)
        save_file(edited, best / "model.safetensors")
        with pytest.raises(UserError, match=re.escape(message)):
            checkpoint.load_model(best, model)
    assert read == []


def test_a_checkpoint_asking_for_a_huge_model_fails_before_allocating_it(tmp_path):
    _fit(tiny_config("train.epochs=1"), tmp_path / "run")
    path = tmp_path / "run/checkpoints/best/checkpoint.json"
    meta = json.loads(path.read_text())
    # 1,000 blocks of width 65,536: about 50 TB of float32 if it were built for real
    meta["config"]["model"]["kwargs"].update(depth=1000, embed_dim=65536, attn_dim=65536, mlp_dim=65536)
    path.write_text(json.dumps(meta))
    with pytest.raises(UserError, match="model.safetensors: tensor .* has shape .*, the model expects"):
        load_checkpoint(tmp_path / "run")


def test_init_from_needs_a_valid_checkpoint_sharing_tensors(tmp_path):
    _fit(tiny_config("train.epochs=1"), tmp_path / "run")
    best = tmp_path / "run/checkpoints/best"
    model = create_model("vit2d_tiny", num_classes=1)
    save_file({f"other.{k}": v for k, v in load_file(best / "model.safetensors").items()}, best / "model.safetensors")
    with pytest.raises(UserError, match="shares no tensor"):
        checkpoint.init_from(model, best)
    (best / "checkpoint.json").write_text("{")
    with pytest.raises(UserError, match="checkpoint.json: unreadable checkpoint metadata"):
        checkpoint.init_from(model, best)


def test_training_state_that_does_not_fit_the_optimizer_is_a_user_error(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    checkpoint.save(tmp_path / "ck", model, _meta(), optimizer, {"epoch": 3})
    other = torch.optim.AdamW(torch.nn.Linear(4, 2).parameters(), lr=0.5)
    with pytest.raises(UserError, match=r"training state does not fit this run \(ValueError: optim.0.exp_avg"):
        checkpoint.load_training_state(tmp_path / "ck", other)
    (tmp_path / "ck/training_state.json").write_text("{}")
    with pytest.raises(UserError, match=r"training_state.json: training state does not fit this run \(KeyError"):
        checkpoint.load_training_state(tmp_path / "ck", optimizer)


def test_a_second_run_on_a_locked_folder_is_refused_at_once(tmp_path):
    """Another process holds the run folder (as a running `medattn train` does); ours must not start."""
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom medattn.train.rundir import run_folder\n"
         "with run_folder(sys.argv[1], False, False):\n    print('held', flush=True)\n    time.sleep(60)\n", str(run)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"output folder {run} is in use by another medattn run"):
            _fit(tiny_config("train.epochs=1"), run)
        assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing written
    finally:
        holder.kill()
        holder.wait()
    _fit(tiny_config("train.epochs=1"), run)  # the lock died with its holder
    assert (run / "checkpoints/best/model.safetensors").is_file()


class Broken(torch.utils.data.Dataset):
    """Training data that fails on first use, as a corrupt file or a bug would."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict:
        raise RuntimeError("unreadable sample")


def test_overwrite_that_fails_before_its_first_checkpoint_keeps_the_previous_run(tmp_path):
    config = tiny_config("train.epochs=1")
    _fit(config, tmp_path / "run")
    before = _snapshot(tmp_path / "run")
    bundle = image_bundle()
    bundle.train = Broken()
    with pytest.raises(RuntimeError, match="unreadable sample"):
        fit(config, bundle, tmp_path / "run", overwrite=True, progress=False, log=lambda m: None)
    assert _snapshot(tmp_path / "run") == before
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(".")) == [".lock"]
    # a fresh run that fails leaves no half run behind either: the same folder can be used again
    with pytest.raises(RuntimeError, match="unreadable sample"):
        fit(config, bundle, tmp_path / "fresh", progress=False, log=lambda m: None)
    assert sorted(p.name for p in (tmp_path / "fresh").iterdir()) == [".lock"]
    # once the new run is complete, it replaces the previous run
    _fit(tiny_config("train.epochs=1", "seed=3"), tmp_path / "run", overwrite=True)
    assert _snapshot(tmp_path / "run")["config.yaml"] != before["config.yaml"]
    assert not (tmp_path / "run/.previous").exists()


def test_overwrite_that_fails_after_training_keeps_the_previous_run(tmp_path):
    """The transaction holds to the end: a test sample broken only past what the checks read fails after training
    (and after the new run's checkpoints), and the previous run's results, predictions and curves are all back."""
    config = tiny_config("train.epochs=1")
    _fit(config, tmp_path / "run")
    before = _snapshot(tmp_path / "run")
    bundle = image_bundle()
    bundle.test = Broken()
    with pytest.raises(RuntimeError, match="unreadable sample"):
        fit(tiny_config("train.epochs=2", "seed=5"), bundle, tmp_path / "run", overwrite=True, progress=False,
            log=lambda m: None)
    assert _snapshot(tmp_path / "run") == before
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(".")) == [".lock"]


def test_a_killed_overwrite_gets_the_previous_run_back(tmp_path):
    """SIGKILL after the old run was set aside but before the new run's first checkpoint."""
    config = tiny_config("train.epochs=1")
    _fit(config, tmp_path / "run")
    before = _snapshot(tmp_path / "run")
    run = tmp_path / "run"
    (run / ".previous").mkdir()
    for name in RUN_FILES:  # as run_folder sets them aside: the run's files that exist (no tensorboard/ here)
        if (run / name).exists():
            os.replace(run / name, run / ".previous" / name)
    (run / "config.yaml").write_text("the killed run's config")
    with pytest.raises(UserError, match="already holds a run"):
        _fit(config, run)
    assert _snapshot(run) == before and not (run / ".previous").exists()


def test_a_checkpoint_saved_before_a_config_key_existed_loads_with_its_default(tmp_path):
    """Keys added to the config since (train.optimizer, train.ema, ...) take today's defaults; unknown keys stay
    an error."""
    model = torch.nn.Linear(2, 1)
    meta = _meta(epoch=1)
    del meta["config"]["train"]["optimizer"], meta["config"]["eval"]
    checkpoint.save(tmp_path / "ck", model, meta)
    loaded = checkpoint.load_meta(tmp_path / "ck")["config"]
    assert loaded["train"]["optimizer"] == DEFAULTS["train"]["optimizer"] and loaded["eval"] == DEFAULTS["eval"]
    meta["config"]["train"]["no_such_key"] = 1
    checkpoint.save(tmp_path / "ck2", model, meta)
    with pytest.raises(UserError, match="no_such_key"):
        checkpoint.load_meta(tmp_path / "ck2")


def test_resume_of_a_run_killed_inside_its_first_last_checkpoint_trains_it_again(tmp_path):
    """SIGKILL inside the first ``checkpoints/last`` write, after ``checkpoints/best`` was written: `--resume` said
    "no checkpoint to resume from" and plain `train` "already holds a run; use --resume", with no way on."""
    config = tiny_config("train.epochs=2")
    run = tmp_path / "run"
    with pytest.raises(Killed):
        _fit(config, run, on_epoch_end=_kill_after(1))
    killed = list(csv.DictReader(open(run / "metrics.csv")))
    os.replace(run / "checkpoints/last", run / "checkpoints/.last.tmp-99999")  # the state the kill leaves
    (run / "checkpoints/.last.tmp-99999/model.safetensors").write_text("half written")
    (run / "notes.txt").write_text("the user's notes")
    before = _snapshot(run)
    with pytest.raises(UserError, match="differs from the run's saved config in train.lr"):
        _fit(tiny_config("train.epochs=2", "train.lr=0.5"), run, resume=True)
    assert _snapshot(run) == {k: v for k, v in before.items() if ".last.tmp" not in k}  # the killed run, tidied
    _fit(config, run, resume=True)
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [r["epoch"] for r in rows] == ["1", "2"] and rows[0] == {**killed[0], "seconds": rows[0]["seconds"]}
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best", "last"]
    assert (run / "notes.txt").read_text() == "the user's notes" and not (run / ".previous").exists()
    # killed before even best (inside its first best write): trained again from epoch 1 when config.yaml is the config
    (tmp_path / "early").mkdir()
    (tmp_path / "early/config.yaml").write_text("seed: 0\n")
    with pytest.raises(UserError, match="differs from the run's saved config in .*data.kind"):
        _fit(config, tmp_path / "early", resume=True)
    # neither a checkpoint nor a config: --resume says what to do
    (tmp_path / "early/config.yaml").unlink()
    (tmp_path / "early/metrics.csv").write_text("epoch\n")
    with pytest.raises(UserError, match="stopped before its first resumable checkpoint .* again with --overwrite"):
        _fit(config, tmp_path / "early", resume=True)
