"""The Metrics tab: reward, accuracy, KL, response length, tokens/s and entropy over steps,
plotted in the terminal (textual-plotext) from the run's ``metrics.jsonl``. KL is the policy's
KL to the reference model (``kl``, logged when algorithm.kl_coef > 0) and the k3 estimate between
trainer and rollout-engine logprobs (``logprob_k3``), whichever the run logged. The y axes get
round ticks labelled with the digits their spacing needs (``axis_ticks``), not plotext's fixed
eleven decimals."""

from __future__ import annotations

import math

from textual.containers import Grid
from textual_plotext import PlotextPlot

from rlx.trace.metrics import Metrics
from rlx.trace.viewer.render import nice_step

PLOTS = (
    ("reward", ("reward_mean",)),
    ("accuracy", ("accuracy", "eval_accuracy")),
    ("KL (to reference; k3 trainer vs rollout)", ("kl", "logprob_k3")),
    ("response length (tokens)", ("response_len_mean",)),
    ("tokens/s", ("tokens_per_s",)),
    ("entropy", ("entropy",)),
)


class MetricPlot(PlotextPlot):
    def __init__(self, metrics: Metrics, title: str, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.metrics, self.title, self.keys = metrics, title, keys

    def on_mount(self) -> None:
        plt = self.plt
        plt.title(self.title)
        plt.xlabel("step")
        plotted = []
        for key in self.keys:
            steps, values = self.metrics.series(key)
            if steps:
                plt.plot(steps, values, label=key, marker="braille")
                plotted += values
        if plotted:
            plt.yticks(*axis_ticks(plotted))
        else:
            plt.title(f"{self.title}: not in this run's metrics ({', '.join(self.keys)})")


def axis_ticks(values: list[float], num_ticks: int = 5) -> tuple[list[float], list[str]]:
    """About ``num_ticks`` round ticks (whole multiples of a 1, 2 or 5 step) over the values' range and
    their labels: fixed-point with the decimals the step needs, scientific outside 1e-3..1e6, so a
    KL of 2e-9 reads ``2e-09``, not ``0.00000000200``. The tick at zero is exactly 0 and reads 0."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return [], []
    lo, hi = min(finite), max(finite)
    if hi - lo <= 1e-12 * max(abs(lo), abs(hi)):  # a flat line
        return [lo], [f"{lo:.4g}"]
    step = nice_step((hi - lo) / num_ticks)
    ticks = [k * step for k in range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)]
    return ticks, _tick_labels(ticks, step)


def _tick_labels(ticks: list[float], step: float) -> list[str]:
    top = max(abs(t) for t in ticks)
    if top == 0 or 1e-3 <= top < 1e6:
        decimals = max(0, -math.floor(math.log10(step) + 1e-9))
        return [f"{t:.{decimals}f}" if t else "0" for t in ticks]
    digits = max(0, math.floor(math.log10(top)) - math.floor(math.log10(step) + 1e-9))
    return [f"{t:.{digits}e}" if t else "0" for t in ticks]


class MetricsView(Grid):
    DEFAULT_CSS = "MetricsView { grid-size: 3 2; grid-gutter: 0 1; }"

    def __init__(self, metrics: Metrics, **kwargs) -> None:
        super().__init__(**kwargs)
        self.metrics = metrics

    def compose(self):
        for title, keys in PLOTS:
            yield MetricPlot(self.metrics, title, keys)
