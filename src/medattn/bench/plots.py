"""Figures of benchmark results (matplotlib with the Agg backend, imported only when a figure is drawn): each
function returns the figure (None without matplotlib) and writes nothing; the bench saves it through its
:class:`~medattn.outputs.OutputFolder` and :func:`close` s it."""

from __future__ import annotations

import importlib.util


def scaling_figure(rows: list[dict]):
    """Two panels, epoch time (h) and peak memory (GiB) versus resolution, one line per mechanism (and variant).

    Log scale on both axes; configurations that were skipped are listed in the legend label.
    Returns the figure, or None where matplotlib is not installed.
    """
    plt = _pyplot()
    if plt is None:
        return None
    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(10, 4))
    for mechanism, variant in dict.fromkeys((row["mechanism"], row.get("variant", "eager")) for row in rows):
        mine = [row for row in rows if row["mechanism"] == mechanism and row.get("variant", "eager") == variant]
        done = [row for row in mine if row["status"] == "ok"]
        skipped = [str(row["resolution"]) for row in mine if row["status"] != "ok"]
        label = mechanism + ("" if variant == "eager" else f" {variant}")
        label += f" (skipped: {', '.join(skipped)})" if skipped else ""
        resolutions = [row["resolution"] for row in done]
        ax_time.plot(resolutions, [row["epoch_h"] for row in done], marker="o", label=label)
        ax_mem.plot(resolutions, [row["peak_mem_mb"] / 1024 for row in done], marker="o", label=label)
    first = rows[0] if rows else {}
    title = (f"{first.get('model', '')} training step, batch {first.get('batch_size', '')}, "
             f"{first.get('precision', '')}, {hardware(rows)}")
    return _finish(fig, ((ax_time, "time per epoch (h)"), (ax_mem, "peak memory (GiB)")),
                   sorted({row["resolution"] for row in rows}), "image size (px)", title, dpi=120)


def attention_scaling_figure(rows: list[dict], title: str):
    """Two panels, time and peak memory of one attention layer (forward + backward) versus the token count N, one
    line per mechanism, log-log; skipped configurations are named in the legend; the title ends with the hardware the
    rows were measured on (:func:`hardware`). None without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(9, 3.6))
    for mechanism in dict.fromkeys(row["mechanism"] for row in rows):
        mine = [row for row in rows if row["mechanism"] == mechanism]
        done = [row for row in mine if row["status"] == "ok"]
        skipped = [str(row["n"]) for row in mine if row["status"] != "ok"]
        label = mechanism + (f" (skipped: {', '.join(skipped)})" if skipped else "")
        ax_time.plot([r["n"] for r in done], [r["median_s"] * 1000 for r in done], marker="o", label=label)
        ax_mem.plot([r["n"] for r in done], [r["peak_mem_mb"] for r in done], marker="o", label=label)
    return _finish(fig, ((ax_time, "time per call (ms)"), (ax_mem, "peak memory (MiB)")),
                   sorted({row["n"] for row in rows}), "tokens N (image patches or bag instances)",
                   ", ".join(filter(None, (title, hardware(rows)))), dpi=110)


def hardware(rows: list[dict]) -> str:
    """What the rows were measured on, for a title: their ``device_name`` (:func:`medattn.bench.common.device_name`:
    the GPU's name on CUDA, else the CPU's model name); empty for no rows."""
    return str(rows[0]["device_name"]) if rows else ""


def _pyplot():
    """matplotlib's pyplot on the Agg backend, or None where matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def close(figure) -> None:
    """Forget ``figure`` (pyplot keeps every figure it made until it is closed), once it is saved."""
    import matplotlib.pyplot as plt

    plt.close(figure)


def _finish(fig, panels, ticks: list, xlabel: str, title: str, dpi: int):
    """Each of ``panels`` ((axis, y label), ...) log-log with the x ``ticks`` named, a grid and a legend; the title;
    ``dpi`` the figure's own (its caller saves it at ``figure.dpi``) -> the figure."""
    for ax, ylabel in panels:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.set_dpi(dpi)
    fig.tight_layout()
    return fig
