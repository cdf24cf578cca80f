"""`rlx plot`: draw metrics over steps from a run's metrics.jsonl into a PNG or SVG (matplotlib, an optional
dependency: the 'logging' extra)."""

from __future__ import annotations

from pathlib import Path

import typer

from rlx.cli.common import UserError, console, printable, user_errors

DEFAULT_METRICS = ["reward_mean", "eval_accuracy"]
IMAGE_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg", "webp")


def plot(
    run: Path = typer.Argument(..., help="Run directory (with metrics.jsonl) or a metrics.jsonl file."),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Image to write (.png or .svg); default "
        "RUN_DIR/plots/metrics-<metric>-<metric>.png, which a new run in "
        "RUN_DIR moves aside with the rest of the old run.",
    ),
    metric: list[str] | None = typer.Option(
        None, "--metric", "-m", help="Metric to draw (repeatable); default reward_mean and eval_accuracy."
    ),
    title: str = typer.Option("", help="Figure title; default the run directory's name."),
) -> None:
    """Plot metrics against step (one panel per metric)."""
    from rlx.launch.run_dir import PLOTS_DIR
    from rlx.trace.sinks import METRICS_FILE, read_metrics

    with user_errors():
        path = run / METRICS_FILE if run.is_dir() else run
        out = out or path.parent / PLOTS_DIR / f"metrics-{'-'.join(metric or DEFAULT_METRICS)}.png"
        _check_out(out)
        if not path.is_file():
            raise UserError(f"no metrics file at {path}; pass a run directory of `rlx train` or its metrics.jsonl")
        if path.stat().st_size > MAX_METRICS_BYTES:  # ~200 bytes a step: a million steps is 0.2 GiB
            raise UserError(
                f"{path} is {path.stat().st_size / 2**30:.0f} GiB, far more than any run's metrics; pass "
                "the metrics.jsonl that `rlx train` wrote"
            )
        try:
            rows = [r for r in read_metrics(path) if _is_number(r["step"])]
        except UnicodeDecodeError as exc:
            raise UserError(
                f"{path} is not UTF-8 text (byte offset {exc.start}); pass the metrics.jsonl that `rlx train` wrote"
            ) from None
        series = _series(rows, metric or DEFAULT_METRICS, path, asked=bool(metric))
        _draw(series, out, title or path.parent.name)
    console.print(f"wrote {out}")


def _series(rows: list[dict], names: list[str], path: Path, asked: bool) -> dict[str, list[tuple[int, float]]]:
    """(step, value) points of each metric. A metric named with -m must have a value; of the default ones, those
    the run has none of are left out (an external task's run has no held-out accuracy: only nulls)."""
    series = {n: [(r["step"], r[n]) for r in rows if _is_number(r.get(n))] for n in names}
    empty = [n for n, points in series.items() if not points]
    if empty and (asked or len(empty) == len(series)):
        with_values = sorted({k for r in rows for k, v in r.items() if k not in ("step", "time") and _is_number(v)})
        only_null = [n for n in empty if any(n in r for r in rows)]
        why = f" ({', '.join(only_null)}: only null, never measured in this run)" if only_null else ""
        raise UserError(
            f"{path} has no values for {', '.join(empty)}{why}; metrics with values: "
            f"{', '.join(with_values) or 'none'}; pick them with -m NAME"
        )
    return {n: points for n, points in series.items() if points}


MAX_METRICS_BYTES = 4 << 30


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_out(out: Path) -> None:
    """The image format comes from --out's suffix; the file must be creatable where it is named."""
    suffix = out.suffix.lower().lstrip(".")
    if suffix not in IMAGE_FORMATS:
        raise UserError(
            f"--out {out}: cannot tell the image format from {out.suffix or 'a name without a suffix'}; "
            f"end it in .png or .svg (or one of {', '.join('.' + f for f in IMAGE_FORMATS[2:])})"
        )
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; name the image file, e.g. {out / 'metrics.png'}")
    blocker = next((p for p in out.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise UserError(f"--out {out}: {blocker} is a file, not a directory; choose another path")


def _draw(series: dict[str, list[tuple[int, float]]], out: Path, title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise UserError("rlx plot needs matplotlib: pip install matplotlib (or pip install 'rlx[logging]')") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(series), figsize=(4.5 * len(series), 3.4), squeeze=False)
    for ax, (name, points) in zip(axes[0], series.items(), strict=True):
        steps, values = zip(*points, strict=True)
        ax.plot(steps, values, marker="o" if len(points) < 30 else None, linewidth=1.6)
        ax.set_title(printable(name))  # a name from the metrics file: no control characters in the image or warnings
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(printable(title))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
