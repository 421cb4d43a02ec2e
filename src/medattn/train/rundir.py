"""The run folder: one run at a time (a lock), ``--overwrite`` as a transaction, tidy after a kill.

A run killed before its first ``checkpoints/last`` has nothing to resume: ``--resume`` trains it again from epoch 1
when it holds a ``checkpoints/best`` of the same config (:func:`stopped_before_last`), or no checkpoint at all and a
config.yaml of the same config (:func:`killed_before_best`: killed inside its first ``best`` write); a folder with
neither gets "no checkpoint to resume from".

A command's inputs are never written over (:func:`check_inputs`): a CONFIG, ``--init-from`` or any file the config
names that lies where the run writes (``DIR/config.yaml``, ``DIR/checkpoints/...``) is refused before anything moves,
with or without ``--overwrite``.

Layout of a run folder (written by :func:`medattn.train.loop.fit`)::

    config.yaml             resolved config
    metrics.csv             one row per epoch (lr, train/val loss, val AUROC or val Dice, seconds)
    training_curves.png     the metrics.csv curves (loss and validation score per epoch)
    checkpoints/last|best   see medattn.runtime.checkpoint
    predictions_test.csv    per-sample test results (see medattn.train.report)
    roc_test.png            ROC curve(s) on the test split (classification only)
    heatmaps/               the highest-scored test cases explained (eval.heatmaps, medattn.explain.cases)
    tensorboard/            the epoch scalars as TensorBoard events (train.tensorboard=true)
    results.json            the summary (also printed)
    report.html             one self-contained page: summary, warnings, ROC, curves, heatmaps (medattn.train.page)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from medattn.config import flatten, read_config_file, with_defaults
from medattn.errors import UserError, writing
from medattn.outputs import remove
from medattn.runtime import checkpoint, distributed

RUN_FILES = ("config.yaml", "metrics.csv", "training_curves.png", "checkpoints", "predictions_test.csv", "roc_test.png",
             "heatmaps", "tensorboard", "results.json", "report.html")
LOCK_FILE = ".lock"  # flock-ed by the run using the folder (never deleted: deleting it would race)
PREVIOUS = ".previous"  # an overwritten run's files wait here until the new run is complete


def check_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse a folder that holds a run unless resuming (then it must hold a checkpoint) or overwriting."""
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise UserError("--resume and --overwrite exclude each other")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"output folder {run_dir} is a file, not a folder")
    if resume and not _resumable(run_dir) and not stopped_before_last(run_dir) and not killed_before_best(run_dir):
        if any((run_dir / name).exists() for name in RUN_FILES):
            raise UserError(f"--resume: the run in {run_dir} stopped before its first resumable checkpoint "
                            f"({run_dir / 'checkpoints' / 'last'}), so there is no checkpoint to resume from: start "
                            f"it again with --overwrite")
        raise UserError(f"--resume: no checkpoint to resume from in {run_dir / 'checkpoints' / 'last'}")
    elif not resume and not overwrite and any((run_dir / name).exists() for name in RUN_FILES):
        raise UserError(f"output folder {run_dir} already holds a run; use --resume to continue it or "
                        f"--overwrite to replace it")


def check_inputs(run_dir: Path, inputs: dict[str, object], resume: bool = False) -> None:
    """Refuse ``inputs`` (what the user calls each -> a path; non-paths and missing files are passed over) that lie
    where the run in ``run_dir`` writes or moves its files (:data:`RUN_FILES`, ``.previous``): the run would move them
    aside and delete them (``--overwrite``) or write over them. A resumed run leaves its ``config.yaml`` alone, so
    ``--resume`` of a run with a checkpoint may read the run's own config (a run trained again from epoch 1 writes
    it)."""
    run_dir = Path(run_dir)
    kept = [name for name in (*RUN_FILES, PREVIOUS) if not (resume and _resumable(run_dir) and name == "config.yaml")]
    for label, value in inputs.items():
        if not isinstance(value, (str, Path)) or not str(value) or "\n" in str(value):
            continue
        try:
            path = Path(value).expanduser()
            if not path.exists():
                continue
            path = path.resolve()
            targets = [(run_dir / name).resolve() for name in kept]
        except (OSError, RuntimeError, ValueError):
            continue
        hit = next((t for t in targets if path == t or t in path.parents), None)
        if hit is not None:
            raise UserError(f"{label} {value} lies inside --out {run_dir}, where the run writes {hit.name}: it would "
                            f"be written over; move it out of that folder or choose another --out")


def config_inputs(config: dict, config_arg: str | None = None, init_from: str | Path | None = None) -> dict:
    """The inputs of a run for :func:`check_inputs`: its CONFIG file, ``--init-from`` and every config value that
    names a file or folder (``data.csv``, ``pretrain.pool``, ...)."""
    found: dict[str, object] = {"CONFIG": config_arg, "--init-from": init_from}
    found.update({k: v for k, v in flatten(config).items() if k != "out" and isinstance(v, str)})
    return found


def killed_before_best(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run killed before any checkpoint (inside its first ``checkpoints/best`` write, or
    earlier in epoch 1): its config.yaml written, no checkpoint, no run set aside (a killed ``--overwrite``, whose
    previous run comes back instead)."""
    checkpoints = Path(run_dir) / "checkpoints"
    return (not _resumable(run_dir) and not any((checkpoints / name).is_dir() for name in ("best", "best.old"))
            and (Path(run_dir) / "config.yaml").is_file() and not (Path(run_dir) / PREVIOUS).exists())


def killed_run_config(run_dir: Path, saved_config: Callable[[Path], dict]) -> dict | None:
    """The saved config of a run killed before its first resumable checkpoint, which ``--resume`` trains again from
    epoch 1: its ``checkpoints/best``'s (read by ``saved_config``), or with no checkpoint at all its config.yaml's;
    None when ``run_dir`` holds no such run."""
    run_dir = Path(run_dir)
    if stopped_before_last(run_dir):
        return saved_config(checkpoint.resolve(run_dir / "checkpoints" / "best"))
    if killed_before_best(run_dir):
        return with_defaults(read_config_file(run_dir / "config.yaml"), str(run_dir / "config.yaml"))
    return None


def _resumable(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a training checkpoint (``checkpoints/last``, or its copy left by a kill)."""
    return any((Path(run_dir) / "checkpoints" / name).exists() for name in ("last", "last.old"))


def stopped_before_last(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run stopped (killed) after writing its first ``checkpoints/best`` and before its
    first ``checkpoints/last`` was complete: nothing to resume, but its config (in best) to train it again."""
    checkpoints = Path(run_dir) / "checkpoints"
    return not _resumable(run_dir) and any((checkpoints / name).is_dir() for name in ("best", "best.old"))


@contextlib.contextmanager
def run_folder(run_dir: Path, resume: bool, overwrite: bool):
    """Hold ``run_dir`` for one run: lock it, tidy up after a killed run, check it, set an overwritten run aside.

    ``--overwrite`` is a transaction: the previous run waits in ``.previous`` until the block ends; only when
    the new run is complete (the block returns) is it deleted. On any failure inside the block (bad input
    found early or after training, Ctrl-C) the new run's files are removed and the previous run comes back;
    after SIGKILL the next command on the folder puts it back (:func:`_recover`). A fresh run that fails
    keeps its checkpoints (``--resume`` continues it). A second run on a locked folder gets a UserError at
    once. Only the main rank touches files.
    """
    run_dir = Path(run_dir)
    if not distributed.is_main():
        check_run_dir(run_dir, resume, overwrite)  # every rank stops on a folder it may not use
        distributed.barrier()
        yield
        return
    with _locked(run_dir):
        _recover(run_dir)
        check_run_dir(run_dir, resume, overwrite)
        overwriting = not resume and any((run_dir / name).exists() for name in RUN_FILES)
        if overwriting:
            _move_run(run_dir, run_dir / PREVIOUS)
        distributed.barrier()
        try:
            yield
        except BaseException:
            if overwriting:
                _put_back(run_dir)
            elif not resume and not (run_dir / "checkpoints" / "last").exists():
                _put_back(run_dir)  # a fresh run that wrote no checkpoint leaves nothing half-made
            raise
        shutil.rmtree(run_dir / PREVIOUS, ignore_errors=True)


@contextlib.contextmanager
def _locked(run_dir: Path):
    """Create ``run_dir`` and hold an exclusive ``flock`` on its lock file (released when the block ends,
    or by the kernel when the process dies)."""
    with writing(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(run_dir / LOCK_FILE, "a")  # noqa: SIM115 (held for the whole block)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise UserError(f"output folder {run_dir} is in use by another medattn run (it holds "
                        f"{run_dir / LOCK_FILE}); wait for it to end or choose another --out") from None
    try:
        yield
    finally:
        handle.close()


def _move_run(source: Path, target: Path) -> None:
    """Move the run files (:data:`RUN_FILES`, nothing else) from ``source`` into ``target`` by rename."""
    present = [name for name in RUN_FILES if (source / name).exists()]
    if present:
        with writing(target):
            target.mkdir(exist_ok=True)
            for name in present:
                os.replace(source / name, target / name)


def _put_back(run_dir: Path) -> None:
    """Remove an unfinished run's files and restore the run set aside in ``.previous`` (if any)."""
    for name in RUN_FILES:
        remove(run_dir / name)
    if (run_dir / PREVIOUS).is_dir():
        _move_run(run_dir / PREVIOUS, run_dir)
        remove(run_dir / PREVIOUS)


def tensorboard_writer(run_dir: Path, first_epoch: int = 1):
    """TensorBoard's ``SummaryWriter`` on ``run_dir/tensorboard``, a folder this transaction owns (one of
    :data:`RUN_FILES`: set aside by ``--overwrite``, removed with an unfinished fresh run). Its event files grow as
    training goes, not renamed into place (TensorBoard reads them while the run trains); a resumed run starts at
    ``first_epoch`` (``purge_step``), so the steps a previous attempt wrote after its checkpoint are dropped."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=first_epoch)


def _recover(run_dir: Path) -> None:
    """After a run killed outright (the lock is ours, so its owner is gone): a previous run it had set aside
    comes back (the killed run was not complete); unfinished checkpoint writes go."""
    checkpoint.clean_stale(run_dir / "checkpoints")
    if (run_dir / PREVIOUS).is_dir():
        _put_back(run_dir)


def config_diff(a: dict, b: dict, ignore: tuple[str, ...] = ("out",)) -> list[str]:
    fa, fb = flatten(a), flatten(b)
    return sorted(k for k in set(fa) | set(fb) if k not in ignore and fa.get(k) != fb.get(k))
