"""The Metrics tab: reward, accuracy, KL, response length, tokens/s and entropy over steps,
plotted in the terminal (textual-plotext) from the run's ``metrics.jsonl``. KL is the policy's
KL to the reference model (``kl``, logged when algorithm.kl_coef > 0) and the k3 estimate between
trainer and rollout-engine logprobs (``logprob_k3``), whichever the run logged."""

from __future__ import annotations

from textual.containers import Grid
from textual_plotext import PlotextPlot

from rlx.trace.metrics import Metrics

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
        plotted = False
        for key in self.keys:
            steps, values = self.metrics.series(key)
            if steps:
                plt.plot(steps, values, label=key, marker="braille")
                plotted = True
        if not plotted:
            plt.title(f"{self.title}: not in this run's metrics ({', '.join(self.keys)})")


class MetricsView(Grid):
    DEFAULT_CSS = "MetricsView { grid-size: 3 2; grid-gutter: 0 1; }"

    def __init__(self, metrics: Metrics, **kwargs) -> None:
        super().__init__(**kwargs)
        self.metrics = metrics

    def compose(self):
        for title, keys in PLOTS:
            yield MetricPlot(self.metrics, title, keys)
