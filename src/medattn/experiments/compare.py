"""Arms over seeds with paired tests: ``medattn compare CONFIG --attention softmax sima seqnorm --seeds 0 1 2``.

An arm is the config with another attention mechanism (``--attention``: ``model.attention``) or another
model preset (``--models``: ``model.name``; the config's mechanism is kept if the preset takes one). Each
(arm, seed) is a normal run with ``seed`` set, in ``DIR/<arm>/seed_<s>``, resumable
(:mod:`medattn.experiments.runs`). The seed drives the model's initialisation, the training order, the
patient-level split and the synthetic generators (unless ``data.seed`` is set): every arm of one seed
sees the same data and the same test cases.

Reported per arm: the test metric per seed and its mean (std) over seeds (sample std, ddof 1), and its
status: an arm with a run that did not learn (:mod:`medattn.train.verdict`: no better than a constant
predictor, or validation AUROC within chance) is marked ``DID NOT LEARN`` in the table, compare.csv and
compare.json, with the reasons, and is left out of the paired tests (a test row says so). Each other arm is
tested against the reference arm (the first, or ``reference``), difference = arm - reference:

* **paired t-test over seeds**: scipy's ``ttest_rel`` on the per-seed test metrics (n = seeds; with 3
  seeds it can only see large, consistent differences); survival: also on the per-seed integrated Brier scores
  (:mod:`medattn.train.survival_report`; lower is better, so a negative difference favours the arm);
* **paired bootstrap over patients**: the mean over seeds of the difference of the test metric on the
  same test cases (:func:`medattn.metrics.paired_bootstrap`: patients resampled within each seed's test
  set, both arms together, ``eval.bootstrap`` resamples); its percentile interval at ``eval.ci`` and a
  two-sided p-value. This one uses every test case, so it is the sharper of the two.

Written to DIR: ``compare.json``, ``compare.csv`` (arms), ``compare_tests.csv`` (tests) and ``compare.png`` (each
arm's metric per seed and its mean; arms that did not learn hatched); the table is
printed. Each arm's row names the config's training values that replaced its model's own settings
(:func:`replaced_settings`); ``init_from`` starts the arms from one checkpoint or one each
(:func:`initial_checkpoints`, e.g. ``medattn pretrain`` per mechanism). Each arm's ``start`` (table, compare.csv,
compare.json, report.html) is the checkpoint its runs started from, whose encoder loaded, or ``scratch``; a finished
run is reused only when it started from the same (:func:`medattn.experiments.runs.job_state`). A DIR holding a
compare.csv or report.html no earlier compare wrote is refused.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np

from medattn import metrics
from medattn.errors import UserError, writing
from medattn.outputs import OutputFolder
from medattn.train.page import ABBREVIATIONS, number, write_page
from medattn.vocabulary.task_types import TASK_TYPES

from .runs import Job, check_summaries, ibs_of, learning_of, mean_std, mean_std_text, metric_of, read_cases, run_jobs

T_TEST = "paired t-test over seeds"
BOOTSTRAP = "paired bootstrap over patients within each seed's test set"
SUMMARY_FILES = ("compare.csv", "compare_tests.csv", "compare.png", "report.html")  # besides compare.json


def arms_of(config: dict, attentions: list[str], models: list[str]) -> dict[str, dict]:
    """arm name -> its config (without the seed): one per mechanism, then one per model preset.

    A model arm keeps only the ``model.kwargs`` its preset takes (a ViT's ``patch_size`` means nothing to a
    ResNet baseline); :func:`left_out_kwargs` names the rest."""
    from medattn.models import takes_attention
    from medattn.models.presets import PRESETS
    from medattn.runtime.build import accepted_kwargs

    arms: dict[str, dict] = {}
    for name, key, value in [*[(a, "attention", a) for a in attentions], *[(m, "name", m) for m in models]]:
        if name in arms:
            raise UserError(f"arm {name!r} is given twice")
        if key == "name" and value not in PRESETS:
            raise UserError(f"--models: unknown model {value!r}; available: {', '.join(sorted(PRESETS))}")
        arm = copy.deepcopy(config)
        arm["model"][key] = value
        accepted = accepted_kwargs(value) if key == "name" else None
        if accepted is not None:
            arm["model"]["kwargs"] = {k: v for k, v in arm["model"]["kwargs"].items() if k in accepted}
        if key == "name" and not takes_attention(value):
            arm["model"]["attention"] = None
        elif key == "name" and arm["model"]["attention"] is None:
            raise UserError(f"--models {value}: the model takes an attention mechanism; the config sets none")
        arms[name] = arm
    if not arms:
        raise UserError("give the arms to compare: --attention MECHANISM ... and/or --models PRESET ...")
    return arms


def left_out_kwargs(config: dict, arms: dict[str, dict]) -> dict[str, list[str]]:
    """arm -> the config's ``model.kwargs`` keys that :func:`arms_of` left out of it (arms with none omitted)."""
    given = config["model"]["kwargs"]
    left_out = {name: sorted(k for k in given if k not in arm["model"]["kwargs"]) for name, arm in arms.items()}
    return {name: keys for name, keys in left_out.items() if keys}


def replaced_settings(config: dict, arms: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """arm -> ``{"train.weight_decay": {"user": 0.05, "own": 0.0001}, ...}``: the training values the user's config
    sets (:data:`medattn.train.defaults.AUTO_KEYS`) that differ from the arm's model's own
    (:func:`~medattn.train.defaults.training_defaults`), so a value written for one arm (a ViT's weight decay) is
    seen replacing another's (attention-MIL's). Arms whose own settings all stand are omitted."""
    from medattn.train.defaults import AUTO_KEYS, training_defaults

    replaced = {}
    for name, arm in arms.items():
        own = training_defaults(arm["model"]["name"])
        given = {f"train.{key}": {"user": config["train"][key], "own": own[key]} for key in AUTO_KEYS
                 if config["train"].get(key) is not None and config["train"][key] != own[key]}
        if given:
            replaced[name] = given
    return replaced


def replaced_text(replaced: dict[str, dict]) -> str:
    """``train.weight_decay 0.05 (own 0.0001), ...`` for one arm."""
    def shown(value) -> str:
        return f"{value:g}" if isinstance(value, (int, float)) else str(value)

    return ", ".join(f"{key} {shown(v['user'])} (own {shown(v['own'])})" for key, v in replaced.items())


def initial_checkpoints(arms: dict[str, dict], init_from: str | Path | None) -> dict[str, str | None]:
    """arm -> the checkpoint its runs start from. ``init_from`` a checkpoint (a run or pretraining folder, a
    weights file): every arm starts from it (shared tensors load into any mechanism). Otherwise a folder of
    per-arm checkpoints, ``init_from/<arm>`` (e.g. ``medattn pretrain`` once per mechanism, so the arms start
    equal): an arm without one starts from scratch (a baseline). None: every arm from scratch. An arm whose model
    cannot take the one checkpoint's encoder (a ResNet arm, a ViT's pretraining) starts from scratch; an arm's own
    checkpoint that does not fit it is refused."""
    from medattn.runtime import checkpoint

    if init_from is None:
        return dict.fromkeys(arms)
    root = Path(init_from)
    if not root.exists():
        raise UserError(f"--init-from {init_from}: no such file or folder")
    try:
        whole = checkpoint.is_plain_weights(root) or bool(checkpoint.resolve(root))
    except UserError:
        whole = False
    if not whole and not any((root / name).is_dir() for name in arms):
        raise UserError(f"--init-from {init_from}: neither a checkpoint nor a folder with one per arm "
                        f"({', '.join(arms)})")
    from medattn.train.model_setup import takes_encoder

    starts = {name: str(root / name) if (root / name).is_dir() else str(root) if whole else None for name in arms}
    for name, start in starts.items():  # an arm is pretrained only when its encoder loads (no checkpoint: its run says)
        if start is not None and _holds_checkpoint(start) and not takes_encoder(arms[name]["model"], start):
            if start != str(root):
                raise UserError(f"--init-from {start}: arm {name}'s model {arms[name]['model']['name']} cannot take "
                                f"its encoder (another preset)")
            starts[name] = None  # one checkpoint for all: an arm of another architecture starts from scratch
    return starts


def _holds_checkpoint(path: str) -> bool:
    """Whether ``path`` is a checkpoint (a weights file, or a folder :func:`checkpoint.resolve` finds one in)."""
    from medattn.runtime import checkpoint

    try:
        return checkpoint.is_plain_weights(path) or bool(checkpoint.resolve(path))
    except UserError:
        return False


def compare_jobs(arms: dict[str, dict], seeds: list[int], init_from: dict[str, str | None] | None = None) -> list[Job]:
    """One job per (arm, seed) in ``<arm>/seed_<s>``, seeds inner; ``init_from``: arm -> its starting checkpoint."""
    if not seeds or len(set(seeds)) != len(seeds) or any(not isinstance(s, int) or s < 0 for s in seeds):
        raise UserError(f"--seeds must be distinct non-negative ints, got {seeds}")
    jobs = []
    for name, arm in arms.items():
        for seed in seeds:
            config = copy.deepcopy(arm)
            config["seed"] = seed
            jobs.append(Job(f"{name}/seed_{seed}", config, (init_from or {}).get(name)))
    return jobs


def reference_arm(arms: dict[str, dict], reference: str | None) -> str:
    """The arm the others are tested against: ``reference``, or the first arm."""
    if reference is not None and reference not in arms:
        raise UserError(f"--reference {reference!r} is not one of the arms: {', '.join(arms)}")
    return reference or next(iter(arms))


def t_test(reference: list[float | None], other: list[float | None]) -> dict:
    """Paired t-test of ``other - reference`` over the seeds where both are defined (scipy ``ttest_rel``)."""
    from scipy.stats import ttest_rel

    pairs = [(a, b) for a, b in zip(reference, other) if a is not None and b is not None]
    result = {"test": T_TEST, "n": len(pairs), "difference": None, "statistic": None, "p_value": None}
    if pairs:
        result["difference"] = float(np.mean([b - a for a, b in pairs]))
    if len(pairs) >= 2 and len({b - a for a, b in pairs}) > 1:
        test = ttest_rel([b for _, b in pairs], [a for a, _ in pairs])
        result.update(statistic=float(test.statistic), p_value=float(test.pvalue))
    elif len(pairs) >= 2:
        result["note"] = "the difference is the same for every seed: no variance to test with"
    return result


def bootstrap_test(reference_dirs: list[Path], other_dirs: list[Path], n_boot: int, ci: float, seed: int) -> dict:
    """Paired bootstrap of the mean over seeds of (other - reference) on each seed's shared test cases."""
    pairs = [(read_cases(a), read_cases(b)) for a, b in zip(reference_dirs, other_dirs)]
    result = {"test": BOOTSTRAP, "n_cases": sum(len(a.ids) for a, _ in pairs)}
    for (a, b), where in zip(pairs, other_dirs):
        if a.ids != b.ids:
            result["note"] = f"{where}: its test cases differ from the reference's; no paired test"
            return result

    def difference(index: list[np.ndarray]) -> float | None:
        values = []
        for (a, b), i in zip(pairs, index):
            score_a, score_b = a.score(i), b.score(i)
            if score_a is None or score_b is None:
                return None
            values.append(score_b - score_a)
        return float(np.mean(values))

    try:
        result.update(metrics.paired_bootstrap(difference, [a.patients for a, _ in pairs], n_boot, ci, seed))
    except metrics.UndefinedMetricError as error:
        result["note"] = str(error)
    return result


def summarise(arms: dict[str, dict], seeds: list[int], results: list[dict], root: Path,
              reference: str | None = None, config: dict | None = None) -> dict:
    """Per-arm metrics over seeds and the paired tests against the reference arm, from the runs' files; with the
    user's ``config``, each arm's ``user_settings`` (:func:`replaced_settings`)."""
    names = list(arms)
    reference = reference_arm(arms, reference)
    replaced = replaced_settings(config, arms) if config is not None else {}
    per_arm = {name: results[i * len(seeds):(i + 1) * len(seeds)] for i, name in enumerate(names)}
    rows, first_metric = [], results[0]["metric"]
    for name in names:
        values = [metric_of(r) for r in per_arm[name]]
        failed = {s: learning_of(r) for s, r in zip(seeds, per_arm[name]) if learning_of(r)}
        rows.append({"arm": name, "model": arms[name]["model"]["name"], "attention": arms[name]["model"]["attention"],
                     "per_seed": values, **mean_std(values), "status": status_of(failed), "did_not_learn": failed,
                     "user_settings": replaced.get(name, {})})
        if first_metric == "c_index":  # issue 51: the integrated Brier score per seed, lower is better
            rows[-1]["ibs_per_seed"] = [ibs_of(r) for r in per_arm[name]]
            rows[-1]["ibs"] = mean_std(rows[-1]["ibs_per_seed"])
    by_arm = {row["arm"]: row for row in rows}
    eval_cfg, seed = arms[reference]["eval"], arms[reference]["seed"]
    tests = []
    for name in names:
        if name == reference:
            continue
        unlearned = [arm for arm in (reference, name) if by_arm[arm]["did_not_learn"]]
        if unlearned:  # a run that learned nothing is a finding, not a result to test against
            tests.append({"arm": name, "reference": reference, "test": "left out", "note": "; ".join(
                f"{arm} did not learn in seed(s) {', '.join(map(str, by_arm[arm]['did_not_learn']))}: "
                f"{next(iter(by_arm[arm]['did_not_learn'].values()))[0]}" for arm in unlearned)})
            continue
        tests.append({"arm": name, "reference": reference, **t_test(by_arm[reference]["per_seed"],
                                                                     by_arm[name]["per_seed"])})
        if "ibs" in by_arm[name]:
            tests.append({"arm": name, "reference": reference, **t_test(by_arm[reference]["ibs_per_seed"],
                                                                         by_arm[name]["ibs_per_seed"]),
                          "test": f"{T_TEST}, integrated Brier score"})
        if eval_cfg["bootstrap"]:
            reference_dirs = [root / reference / f"seed_{s}" for s in seeds]
            arm_dirs = [root / name / f"seed_{s}" for s in seeds]
            tests.append({"arm": name, "reference": reference, **bootstrap_test(
                reference_dirs, arm_dirs, eval_cfg["bootstrap"], eval_cfg["ci"], seed)})
    first = results[0]
    return {"metric": first["metric"], "data": first["data"], "synthetic": first["synthetic"], "seeds": seeds,
            "reference": reference, "ci": eval_cfg["ci"], "std": "sample standard deviation over seeds (ddof 1)",
            "difference": "arm - reference", "arms": rows, "tests": tests}


def status_of(failed: dict) -> str:
    """``learned``, or ``did not learn (seed 0, 2)`` for an arm whose runs in those seeds did not learn."""
    return "learned" if not failed else f"DID NOT LEARN (seed {', '.join(map(str, failed))})"


def format_summary(summary: dict) -> str:
    from medattn.text import format_table

    label = ABBREVIATIONS.get(summary["metric"], summary["metric"])
    tag = "  [SYNTHETIC data]" if summary["synthetic"] else ""
    seeds = [f"seed {s}" for s in summary["seeds"]]
    arms = [{"arm": r["arm"], "start": r.get("start", "scratch"), **dict(zip(seeds, r["per_seed"])),
             "summary": mean_std_text(r), "status": r["status"],
             "settings": replaced_text(r.get("user_settings") or {})} for r in summary["arms"]]
    tests = []
    for t in summary["tests"]:
        interval = "" if t.get("ci_low") is None else f"{t['ci_low']:+.3f} to {t['ci_high']:+.3f}"
        name = t["test"] + (f" ({t['n']})" if "n" in t else "" if t["test"] == "left out"
                            else f" ({t.get('n_boot', 0)} resamples)")
        tests.append({"arm": t["arm"], "test": name, "difference": t.get("difference"), "interval": interval,
                      "p": t.get("p_value"), "note": t.get("note", "")})
    return "\n".join([
        f"test {label} on {summary['data']}{tag}: per seed, mean (std) over seeds",
        format_table(arms, [("arm", "arm", ""), ("start", "start", ""), *[(s, s, ".3f") for s in seeds],
                            ("summary", "mean (std)", ""),
                            ("status", "status", ""), ("settings", "the config's values over the model's own", "")]),
        *(["integrated Brier score (lower is better), mean (std) over seeds: " + ", ".join(
            f"{r['arm']} {mean_std_text(r['ibs'])}" for r in summary["arms"])] if "ibs" in summary["arms"][0] else []),
        *[f"{r['arm']}: did not learn in seed {seed_}: {'; '.join(reasons)}" for r in summary["arms"]
          for seed_, reasons in r["did_not_learn"].items()],
        "", f"paired tests against {summary['reference']} (difference = arm - {summary['reference']}, "
            f"{round(100 * summary['ci'])}% interval)",
        format_table(tests, [("arm", "arm", ""), ("test", "test", ""), ("difference", "difference", "+.4f"),
                             ("interval", "interval", ""), ("p", "p", ".3g"), ("note", "", "")]),
    ])


def plot_arms(summary: dict, folder: OutputFolder, name: str = "compare.png"):
    """``name`` in ``folder``: each arm's test metric per seed (points) and its mean (bar), arms that did not learn
    hatched and named so, an arm started from a checkpoint labelled ``from <its name>``; -> the axes (closed), for
    tests."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = ABBREVIATIONS.get(summary["metric"], summary["metric"])
    arms = summary["arms"]
    fig, axis = plt.subplots(figsize=(1.2 + 1.1 * len(arms), 3.6))
    for i, arm in enumerate(arms):
        values = [v for v in arm["per_seed"] if v is not None]
        learned = arm["status"] == "learned"
        axis.bar(i, arm["mean"] if arm["mean"] is not None else 0, color="C0" if learned else "0.8",
                 hatch="" if learned else "//", edgecolor="0.3", width=0.6)
        axis.plot([i] * len(values), values, "o", color="black", markersize=4)
    axis.set_xticks(range(len(arms)), [a["arm"] + ("" if a["status"] == "learned" else "\n(did not learn)")
                                       + ("" if a.get("start", "scratch") == "scratch"
                                          else f"\nfrom {Path(a['start']).name}") for a in arms], fontsize=8)
    axis.set_ylabel(f"test {label}")
    chance = {kind.metric: kind.chance_score for kind in TASK_TYPES.values()}.get(summary["metric"])
    if chance is not None:  # where a scorer unrelated to the labels lands (TaskType.chance_score)
        axis.axhline(chance, color="0.5", linestyle=":", linewidth=1)
    axis.set_title(f"{summary['data']}: mean over seeds {summary['seeds']} (points: seeds)"
                   + (" [SYNTHETIC data]" if summary["synthetic"] else ""), fontsize=9)
    fig.tight_layout()
    folder.save_figure(name, fig, dpi=100)
    plt.close(fig)
    return axis


def compare(config: dict, attentions: list[str], models: list[str], seeds: list[int], root: str | Path, *,
            reference: str | None = None, progress: bool = True, log: Callable[[str], None] = print,
            init_from: str | Path | None = None) -> dict:
    """Run (or resume) every (arm, seed) under ``root``, write compare.json, compare.csv and
    compare_tests.csv there, print the tables and return the summary (:func:`summarise`). ``init_from``: the
    checkpoint new runs start from (:func:`initial_checkpoints`: one per arm or one for all)."""
    root = Path(root)
    arms = arms_of(config, attentions, models)
    for name, keys in left_out_kwargs(config, arms).items():
        log(f"arm {name}: model.kwargs {', '.join(keys)} left out (its model {arms[name]['model']['name']!r} "
            f"takes no such argument)")
    reference_arm(arms, reference)
    for name, replaced in replaced_settings(config, arms).items():
        log(f"arm {name}: the config's {replaced_text(replaced)} replace its model's own settings")
    check_summaries(root, "compare", "compare.json", ("arms", "tests"), SUMMARY_FILES)  # before any run
    starts = initial_checkpoints(arms, init_from)
    for name, start in starts.items():
        if start is not None or init_from is not None:
            log(f"arm {name}: starts from {start or 'scratch (no checkpoint that fills its encoder)'}")
    results = run_jobs(compare_jobs(arms, seeds, starts), root, progress=progress, log=log)
    summary = summarise(arms, seeds, results, root, reference, config)
    for row in summary["arms"]:  # what each arm started from: a checkpoint (its encoder loaded) or scratch
        row["start"] = starts[row["arm"]] or "scratch"
    out = OutputFolder(root, resume=True)  # its runs resume; the summaries are this command's, written again
    with writing(root):
        out.save_json("compare.json", summary)
        out.save_csv("compare.csv", ["arm", "model", "attention", "start", *[f"seed_{s}" for s in seeds], "mean",
                                     "std", "n_seeds", "status", "user_settings"],
                  [[r["arm"], r["model"], r["attention"], r["start"], *r["per_seed"], r["mean"], r["std"], r["n"],
                    r["status"], replaced_text(r["user_settings"])] for r in summary["arms"]])
        keys = ["arm", "reference", "test", "n", "n_cases", "n_boot", "difference", "statistic", "ci_low", "ci_high",
                "p_value", "note"]
        out.save_csv("compare_tests.csv", keys, [[t.get(k) for k in keys] for t in summary["tests"]])
        plot_arms(summary, out)
        write_page(out, f"comparison on {summary['data']} (seeds {summary['seeds']})", summary["synthetic"],
                   [["arm", "start", "mean", "std", "status"],
                    *[[r["arm"], r["start"], number(r["mean"]), number(r["std"]), r["status"]]
                      for r in summary["arms"]]],
                   [t["note"] for t in summary["tests"] if t.get("note")], ["compare.png"])
    log(format_summary(summary))
    return summary
