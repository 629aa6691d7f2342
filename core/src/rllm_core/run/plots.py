"""``reward.png`` and ``loss.png`` from the metrics lines, drawn headless with matplotlib, and
``eval.png`` (every ``eval/pass@*`` and ``eval/mean_reward`` by step) once a step has
evaluated (``[run].eval_every``).

matplotlib is optional: without it :func:`write_plots` returns a message saying how to get
the plots and the run goes on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["NO_MATPLOTLIB", "headless_pyplot", "series", "write_plots"]

NO_MATPLOTLIB = "plots are off: matplotlib is not installed (pip install matplotlib)"


def headless_pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only backend, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """The steps and values of ``key`` in the metrics lines that have it."""
    points = [(int(r["step"]), float(r[key])) for r in rows if key in r]
    return [p[0] for p in points], [p[1] for p in points]


def write_plots(rows: Sequence[Mapping[str, Any]], folder: Path) -> str | None:
    """Rewrite ``folder/reward.png`` (reward mean with min-max band, accuracy) and
    ``folder/loss.png`` (every ``train/*loss`` metric). Returns None, or why nothing was drawn."""
    plt = headless_pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    if not rows:
        return None
    steps, mean = series(rows, "reward/mean")
    _, low = series(rows, "reward/min")
    _, high = series(rows, "reward/max")
    acc_steps, accuracy = series(rows, "accuracy")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.fill_between(steps, low, high, alpha=0.2, label="reward min-max")
    ax.plot(steps, mean, marker="o", label="reward mean")
    ax.plot(acc_steps, accuracy, marker=".", linestyle="--", label="accuracy")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(folder / "reward.png")
    plt.close(fig)

    loss_keys = sorted({k for r in rows for k in r if k.startswith("train/") and "loss" in k})
    fig, ax = plt.subplots(figsize=(6, 4))
    for key in loss_keys:
        xs, ys = series(rows, key)
        ax.plot(xs, ys, marker="o", label=key.removeprefix("train/"))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if loss_keys:
        ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(folder / "loss.png")
    plt.close(fig)
    _eval_plot(plt, rows, folder)
    return None


def _eval_plot(plt: Any, rows: Sequence[Mapping[str, Any]], folder: Path) -> None:
    keys = sorted(
        {k for r in rows for k in r if k.startswith("eval/pass@") or k == "eval/mean_reward"}
    )
    if not keys:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for key in keys:
        xs, ys = series(rows, key)
        ax.plot(xs, ys, marker="o", label=key.removeprefix("eval/"))
    ax.set_xlabel("step")
    ax.set_ylabel("eval split")
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(folder / "eval.png")
    plt.close(fig)
