"""Figures of survival and regression results: Kaplan-Meier curves of the low- and high-risk groups with the
log-rank p-value and the numbers at risk; predicted against true values with the identity line.

Each function returns a :class:`matplotlib.figure.Figure` drawn on an Agg canvas and kept out of pyplot's list
of open figures (nothing to close); the caller saves it through the output policy
(``medattn.outputs.save_figure(path, fig)`` or ``OutputFolder.save_figure``).
"""

from __future__ import annotations

import numpy as np

from medattn.metrics import UndefinedMetricError, fit_title, wrap_title
from medattn.metrics_regression import mae, pearson_r, r2, rmse
from medattn.metrics_survival import _arrays, kaplan_meier, logrank_test


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _steps(time: np.ndarray, event: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Kaplan-Meier curve as step vertices (``where="post"``) from (0, 1) to the last follow-up time."""
    times, survival = kaplan_meier(time, event)
    end = time.max()
    return np.concatenate([[0.0], times, [end]]), np.concatenate([[1.0], survival, [survival[-1] if len(times)
                                                                                     else 1.0]])


def events_text(count: int) -> str:
    """``"1 event"``, ``"0 events"``, ``"12 events"``."""
    return f"{count} event" if count == 1 else f"{count} events"


def time_axis_label(column: str | None = None, unit: str | None = None) -> str:
    """The time axis's label: the time column's name with its unit where known, ``"os_months (months)"``; the unit
    is read from a word in the name (days, weeks, months, years) when not given; a name that is the unit itself
    (``"months"``) stands alone; ``"time"`` without a name."""
    if unit is None and column:
        words = column.lower().replace("-", "_").replace(" ", "_").split("_")
        found = [u for u in ("days", "weeks", "months", "years") if u in words or u[:-1] in words]
        unit = found[0] if found else None
    name = column or "time"
    bare = name.strip().lower() in (unit, unit[:-1]) if unit else False  # a column named "months": no "(months)"
    return f"{name} ({unit})" if unit and not bare else name


def kaplan_meier_figure(time, event, high_risk, title: str = "", time_unit: str | None = None,
                        at_risk: bool = True, time_label: str | None = None):
    """Kaplan-Meier curves of the low-risk (``high_risk`` False) and high-risk groups -> Figure.

    ``time``, ``event``, ``high_risk`` (N,) (:func:`medattn.metrics_survival.risk_groups` gives the last). The
    legend names each group with its size and events and the two-group log-rank p-value
    (:func:`~medattn.metrics_survival.logrank_test`; "n/a" where undefined); censored samples are marked "+".
    ``at_risk``: the numbers at risk of each group under the x ticks. The x axis reads ``time_label``, else
    "time (``time_unit``)", else "time".
    """
    time, event = _arrays(time, event)
    high_risk = np.asarray(high_risk).astype(bool)
    if high_risk.shape != time.shape:
        raise ValueError(f"high_risk must be (N,) like time {time.shape}, got {high_risk.shape}")
    try:
        p_value = f"p = {logrank_test(time, event, high_risk)[1]:.3g}"
    except UndefinedMetricError:
        p_value = "p n/a"
    fig = _figure(5.5, 4.4 if at_risk else 4.2)
    ax = fig.add_subplot()
    groups = [("low risk", ~high_risk, "C0"), ("high risk", high_risk, "C3")]
    for name, members, colour in groups:
        if not members.any():
            continue
        t, e = time[members], event[members]
        x, y = _steps(t, e)
        ax.step(x, y, where="post", color=colour, label=f"{name} (n={members.sum()}, {events_text(int(e.sum()))})")
        censored = t[~e]
        steps_before = np.searchsorted(x[1:-1], censored, side="right")  # S at each censoring time
        ax.plot(censored, y[steps_before], "+", color=colour, markersize=6)
    ax.set(xlabel=time_label or time_axis_label(None, time_unit), ylabel="survival probability", ylim=(0, 1.02),
           xlim=(0, None))
    ax.legend(title=f"log-rank {p_value}", loc="upper right", fontsize=8, title_fontsize=8)
    ax.set_title(wrap_title(title, 60), fontsize=9)
    fig.tight_layout()
    if at_risk:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        for row, (name, members, colour) in enumerate(groups):
            counts = [int((time[members] >= t).sum()) for t in ticks]
            y = -0.2 - 0.07 * row
            ax.text(-0.04, y, name, transform=ax.transAxes, ha="right", va="top", fontsize=7, color=colour)
            for t, count in zip(ticks, counts):
                ax.text(t, y, str(count), transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=7,
                        color=colour)
        ax.text(-0.04, -0.2 + 0.07, "at risk", transform=ax.transAxes, ha="right", va="top", fontsize=7)
        fig.subplots_adjust(bottom=0.3, left=0.2)
    fit_title(fig, ax.title)
    return fig


def predicted_vs_true_figure(pred, true, name: str = "", unit: str = ""):
    """Scatter of predicted against true values of one output with the identity line -> Figure.

    ``pred``, ``true`` (N,); the title holds ``name`` with MAE, RMSE, R^2 and Pearson's r (those undefined on
    these values, for a constant target or prediction, are left out); axes read "true/predicted ``name``
    (``unit``)".
    """
    pred = np.asarray(pred, dtype=np.float64)
    true = np.asarray(true, dtype=np.float64)
    if pred.ndim != 1 or pred.shape != true.shape or len(pred) == 0:
        raise ValueError(f"pred and true must be (N,) of one shape, got {pred.shape} and {true.shape}")
    scores = []
    for label, metric in (("MAE", mae), ("RMSE", rmse), ("R²", r2), ("r", pearson_r)):
        try:
            scores.append(f"{label} {metric(pred, true):.3g}")
        except UndefinedMetricError:
            continue
    fig = _figure(4.5, 4.5)
    ax = fig.add_subplot()
    ax.scatter(true, pred, s=12, alpha=0.6, edgecolors="none")
    low, high = min(true.min(), pred.min()), max(true.max(), pred.max())
    margin = 0.05 * (high - low) or 1.0
    limits = (low - margin, high + margin)
    ax.plot(limits, limits, color="grey", linestyle=":", linewidth=1, label="identity")
    suffix = f" ({unit})" if unit else ""
    ax.set(xlim=limits, ylim=limits, xlabel=f"true {name}".strip() + suffix,
           ylabel=f"predicted {name}".strip() + suffix, aspect="equal")
    ax.set_title(wrap_title(", ".join([f"{name}: n={len(pred)}" if name else f"n={len(pred)}", *scores]), 52),
                 fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fit_title(fig, ax.title)
    return fig


def calibration_figure(calibration: dict, title: str = "", time_label: str = "time"):
    """Calibration at one time -> Figure: each risk group's mean predicted survival (x) against its Kaplan-Meier
    observed survival (y) at ``calibration["time"]`` (:func:`medattn.metrics_survival_brier.calibration_at`), the
    points labelled with the group's size and events, and the identity line (perfect calibration). Groups not
    followed until that time are left out."""
    fig = _figure(4.5, 4.5)
    ax = fig.add_subplot()
    ax.plot((0, 1), (0, 1), color="grey", linestyle=":", linewidth=1, label="perfect calibration")
    seen = [g for g in calibration["groups"] if g["observed"] is not None]
    ax.plot([g["predicted"] for g in seen], [g["observed"] for g in seen], "o-", color="C0",
            label="risk groups (Kaplan-Meier)")
    for g in seen:
        ax.annotate(f"n={g['n']}, {events_text(g['events'])}", (g["predicted"], g["observed"]), fontsize=7,
                    textcoords="offset points", xytext=(4, -10))
    error = calibration.get("error")
    at = f"t = {calibration['time']:g}"
    ax.set(xlim=(0, 1), ylim=(0, 1.02), aspect="equal", xlabel=f"predicted survival at {at}",
           ylabel=f"Kaplan-Meier survival at {at}")
    heading = ", ".join(v for v in (title, f"mean |predicted - observed| {error:.3f}" if error is not None else "")
                        if v)
    ax.set_title(wrap_title(heading, 52), fontsize=9)
    ax.legend(loc="upper left", fontsize=8, title=f"t: {time_label}", title_fontsize=8)
    fig.tight_layout()
    fit_title(fig, ax.title)
    return fig
