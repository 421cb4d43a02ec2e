"""Issue 38's GPU targets judged on the results of `medattn bench attention` and `medattn bench scaling`.

    python benchmarks/kernel_targets.py --attention reports/gpu/attention/attention.json \
        --scaling reports/gpu/scaling-b1/scaling.json reports/gpu/scaling-b4/scaling.json --out reports/gpu/targets

Reads the benches' JSON (``{"environment", "results"}``), bf16 rows, and prints one line per target with the
figures it rests on, the verdict (``met``, ``NOT MET`` or ``not measured`` where a row is missing or was skipped)
and the device the rows name; writes ``targets.json`` and ``targets.csv`` with ``--out``. SeqNorm and
binary-hamming are taken from the rows with ``implementation`` ``triton`` where the results have such rows (CUDA
with triton installed), otherwise from the rows without one (then the verdicts judge the PyTorch paths, and the
``kernels`` field says so). The targets (one attention layer, dim 512, 8 heads, forward + backward; training step
of ``vit2d``, eager):

* SeqNorm layer no slower than softmax (SDPA) at N = 4,096, at least 3x faster at 16,384, 10x at 65,536
  (:data:`LAYER_SPEEDUP`); no slower than SimA's eager layer at any N both were measured at;
* the SeqNorm training step at 1024 px no slower than softmax's, at each batch size measured (the issue: 1 and 4);
* binary-hamming at 16,384 tokens: peak memory within 2x of SeqNorm's layer, time no worse than SDPA's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from medattn.outputs import OutputFolder
from medattn.text import format_table

#: N -> how many times faster than softmax's layer SeqNorm's must be.
LAYER_SPEEDUP = {4096: 1.0, 16384: 3.0, 65536: 10.0}
#: The resolution of the training-step target (px) and the tokens of the binary-hamming target.
STEP_RESOLUTION = 1024
HAMMING_TOKENS = 16384
#: The row fields this script reads (tests/bench/test_kernel_targets.py checks the benches write them).
ATTENTION_FIELDS = ("mechanism", "part", "n", "pass", "precision", "status", "median_s", "peak_mem_mb")
SCALING_FIELDS = ("mechanism", "model", "resolution", "batch_size", "variant", "status", "step_s")
KERNEL_MECHANISMS = ("seqnorm", "binary-hamming")


def _measured(row: dict | None) -> bool:
    return row is not None and row.get("status") == "ok"


def layer_rows(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """bf16 layer forward+backward rows by (mechanism, N); the kernels' rows for the mechanisms that have them."""
    kernels = any(row.get("implementation") == "triton" for row in rows)
    chosen = {}
    for row in rows:
        if (row.get("part"), row.get("pass"), row.get("precision")) != ("layer", "fwd+bwd", "bf16"):
            continue
        wanted = "triton" if kernels and row["mechanism"] in KERNEL_MECHANISMS else None
        if row.get("implementation") == wanted:
            chosen[(row["mechanism"], row["n"])] = row
    return chosen


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else "met" if ok else "NOT MET"


def judge_layers(rows: list[dict]) -> list[dict]:
    """The layer targets against softmax and SimA, and binary-hamming's at :data:`HAMMING_TOKENS`."""
    chosen, verdicts = layer_rows(rows), []
    for n, speedup in LAYER_SPEEDUP.items():
        seqnorm, softmax = chosen.get(("seqnorm", n)), chosen.get(("softmax", n))
        ratio = softmax["median_s"] / seqnorm["median_s"] if _measured(seqnorm) and _measured(softmax) else None
        verdicts.append({"target": f"SeqNorm layer vs softmax at N={n}", "wanted": f">= {speedup:g}x",
                         "measured": None if ratio is None else f"{ratio:.2f}x",
                         "verdict": _verdict(None if ratio is None else ratio >= speedup)})
    pairs = sorted(n for mechanism, n in chosen if mechanism == "seqnorm" and _measured(chosen[(mechanism, n)])
                   and _measured(chosen.get(("sima", n))))
    slower = [n for n in pairs if chosen[("seqnorm", n)]["median_s"] > chosen[("sima", n)]["median_s"]]
    ratios = ", ".join(f"N={n}: {chosen[('sima', n)]['median_s'] / chosen[('seqnorm', n)]['median_s']:.2f}x"
                       for n in pairs)
    verdicts.append({"target": "SeqNorm layer vs SimA's eager layer, every N", "wanted": ">= 1x",
                     "measured": ratios or None, "verdict": _verdict(None if not pairs else not slower)})
    hamming, seqnorm, softmax = (chosen.get((m, HAMMING_TOKENS)) for m in ("binary-hamming", "seqnorm", "softmax"))
    memory = hamming["peak_mem_mb"] / seqnorm["peak_mem_mb"] if _measured(hamming) and _measured(seqnorm) else None
    time = hamming["median_s"] / softmax["median_s"] if _measured(hamming) and _measured(softmax) else None
    verdicts.append({"target": f"binary-hamming memory vs SeqNorm's layer at N={HAMMING_TOKENS}", "wanted": "<= 2x",
                     "measured": None if memory is None else f"{memory:.2f}x",
                     "verdict": _verdict(None if memory is None else memory <= 2.0)})
    verdicts.append({"target": f"binary-hamming time vs softmax at N={HAMMING_TOKENS}", "wanted": "<= 1x",
                     "measured": None if time is None else f"{time:.2f}x",
                     "verdict": _verdict(None if time is None else time <= 1.0)})
    return verdicts


def judge_steps(rows: list[dict]) -> list[dict]:
    """The vit2d training step at :data:`STEP_RESOLUTION` px, eager bf16, SeqNorm against softmax, per batch size."""
    def step(mechanism: str, batch: int) -> dict | None:
        names = ("eager bf16 triton", "eager bf16") if mechanism == "seqnorm" else ("eager bf16",)
        found = {row["variant"]: row for row in rows if (row.get("mechanism"), row.get("model"),
                 row.get("resolution"), row.get("batch_size")) == (mechanism, "vit2d", STEP_RESOLUTION, batch)}
        return next((found[name] for name in names if name in found), None)

    verdicts = []
    for batch in sorted({row.get("batch_size") for row in rows if row.get("batch_size") is not None}) or [1]:
        seqnorm, softmax = step("seqnorm", batch), step("softmax", batch)
        ratio = softmax["step_s"] / seqnorm["step_s"] if _measured(seqnorm) and _measured(softmax) else None
        verdicts.append({"target": f"vit2d step at {STEP_RESOLUTION} px, batch {batch}: SeqNorm vs softmax",
                         "wanted": ">= 1x", "measured": None if ratio is None else f"{ratio:.2f}x",
                         "verdict": _verdict(None if ratio is None else ratio >= 1.0),
                         "variant": None if seqnorm is None else seqnorm["variant"]})
    return verdicts


def _load(paths: list[Path]) -> tuple[list[dict], list[dict]]:
    """Rows and environments of the benches' JSON files."""
    rows, environments = [], []
    for path in paths:
        data = json.loads(path.read_text())
        rows += data["results"]
        environments.append(data["environment"])
    return rows, environments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attention", type=Path, nargs="*", default=[], help="attention.json of bench attention")
    parser.add_argument("--scaling", type=Path, nargs="*", default=[], help="scaling.json of bench scaling, each")
    parser.add_argument("--out", type=Path, default=None, help="folder for targets.json and targets.csv")
    args = parser.parse_args()
    attention, environments = _load(args.attention)
    scaling, more = _load(args.scaling)
    kernels = "triton" if any(row.get("implementation") == "triton" for row in attention + scaling) else "none"
    verdicts = [{**v, "kernels": kernels} for v in judge_layers(attention) + judge_steps(scaling)]
    devices = sorted({str(env.get("device_name") or env.get("device")) for env in environments + more})
    print(f"devices: {', '.join(devices) or 'none'}; Triton kernels in the rows: {kernels}")
    print(format_table(verdicts, [("target", "target", ""), ("wanted", "wanted", ""), ("measured", "measured", ""),
                                  ("verdict", "verdict", "")]))
    if args.out is not None:
        out = OutputFolder(args.out, overwrite=True)
        out.save_json("targets.json", {"devices": devices, "targets": verdicts}, indent=2)
        out.save_dicts("targets.csv", verdicts, list(dict.fromkeys(key for v in verdicts for key in v)))
        print(f"wrote {args.out / 'targets.json'} and targets.csv")


if __name__ == "__main__":
    main()
