"""`rlx plot`: draw metrics over steps from a run's metrics.jsonl into a PNG or SVG."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from rlx.cli.common import UserError, console, user_errors

DEFAULT_METRICS = ["reward_mean", "eval_accuracy"]


def plot(
    run: Path = typer.Argument(..., help="Run directory (with metrics.jsonl) or a metrics.jsonl file."),
    out: Path = typer.Option(Path("metrics.png"), "--out", "-o", help="Image to write (.png or .svg)."),
    metric: Optional[List[str]] = typer.Option(None, "--metric", "-m",
                                               help="Metric to draw (repeatable); default reward_mean and "
                                                    "eval_accuracy."),
    title: str = typer.Option("", help="Figure title; default the run directory's name."),
) -> None:
    """Plot metrics against step (one panel per metric)."""
    from rlx.trace.sinks import METRICS_FILE, read_metrics

    with user_errors():
        path = run / METRICS_FILE if run.is_dir() else run
        if not path.is_file():
            raise UserError(f"no metrics file at {path}; pass a run directory of `rlx train` or its metrics.jsonl")
        rows = read_metrics(path)
        names = metric or DEFAULT_METRICS
        series = {n: [(r["step"], r[n]) for r in rows if isinstance(r.get(n), (int, float))] for n in names}
        empty = [n for n, points in series.items() if not points]
        if empty:
            known = sorted({k for r in rows for k in r if k not in ("step", "time")})
            raise UserError(f"{path} has no values for {', '.join(empty)}; metrics in it: {', '.join(known)}")
        _draw(series, out, title or path.parent.name)
    console.print(f"wrote {out}")


def _draw(series: dict[str, list[tuple[int, float]]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(series), figsize=(4.5 * len(series), 3.4), squeeze=False)
    for ax, (name, points) in zip(axes[0], series.items()):
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o" if len(points) < 30 else None, linewidth=1.6)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
