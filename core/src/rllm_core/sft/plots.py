"""``loss.png`` of an SFT run: train NLL per step and eval NLL where it was scored, drawn
headless with matplotlib (optional, as for ``rllm-core run``'s plots)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rllm_core.run.plots import NO_MATPLOTLIB, headless_pyplot, series

__all__ = ["write_sft_plots"]


def write_sft_plots(rows: Sequence[Mapping[str, Any]], folder: Path) -> str | None:
    """Rewrite ``folder/loss.png``; returns None, or why nothing was drawn."""
    plt = headless_pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label, style in (("train/nll", "train nll", "-"), ("eval/nll", "eval nll", "--")):
        steps, values = series(rows, key)
        if steps:
            ax.plot(steps, values, marker="o", linestyle=style, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("negative log-likelihood")
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(folder / "loss.png")
    plt.close(fig)
    return None
