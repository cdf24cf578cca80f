"""What an FP8 conversion did: per-tensor dequantization error, what was kept, bytes in and out.

Errors are relative to the tensor's own magnitude, so they compare across tensors:
``max_rel = max|deq - w| / max|w|`` and ``mean_rel = sum|deq - w| / sum|w|``. For e4m3 the first is
at most 2^-4 = 0.0625 for any strategy (the largest element of a block, row or tensor maps to
448 exactly; others round within half a step). Left out: model-level quality (compare logits).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rlx.convert.units import format_bytes


@dataclass
class TensorStats:
    name: str
    max_abs_err: float = 0.0
    sum_abs_err: float = 0.0
    sum_abs: float = 0.0
    amax: float = 0.0
    numel: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, part, numel: int) -> None:
        """Fold in the error of one quantized row block (an ``rlx.convert.fp8.quantize.Quantized``)."""
        with self._lock:
            self.max_abs_err = max(self.max_abs_err, part.max_abs_err)
            self.sum_abs_err += part.sum_abs_err
            self.sum_abs += part.sum_abs
            self.amax = max(self.amax, part.amax)
            self.numel += numel

    @property
    def max_rel(self) -> float:
        return self.max_abs_err / self.amax if self.amax else 0.0

    @property
    def mean_rel(self) -> float:
        return self.sum_abs_err / self.sum_abs if self.sum_abs else 0.0


@dataclass
class Fp8Report:
    destination: str
    strategy: str
    block: tuple[int, int]
    quantized: list[TensorStats]
    kept: list[tuple[str, str]]
    bytes_in: int
    bytes_out: int
    seconds: float

    def to_json(self) -> dict:
        return {
            "destination": self.destination,
            "strategy": self.strategy,
            "block_size": list(self.block),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "seconds": self.seconds,
            "quantized": [
                {"name": s.name, "max_rel_error": s.max_rel, "mean_rel_error": s.mean_rel, "numel": s.numel}
                for s in self.quantized
            ],
            "kept": [{"name": n, "reason": why} for n, why in self.kept],
        }

    def write_json(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")


def render_report(report: Fp8Report, console: Console, top: int = 8) -> None:
    worst = sorted(report.quantized, key=lambda s: s.max_rel, reverse=True)[:top]
    table = Table(
        title=f"FP8 {report.strategy}: {len(report.quantized)} tensors quantized, worst {len(worst)} "
        "by max relative error"
    )
    for column in ("tensor", "max rel err", "mean rel err", "elements"):
        table.add_column(column, overflow="fold")
    for s in worst:
        table.add_row(s.name, f"{s.max_rel:.4f}", f"{s.mean_rel:.4f}", f"{s.numel:,}")
    console.print(table)
    reasons: dict[str, int] = {}
    for _, why in report.kept:
        reasons[why] = reasons.get(why, 0) + 1
    kept = ", ".join(f"{count} {why}" for why, count in sorted(reasons.items()))
    mean = sum(s.sum_abs_err for s in report.quantized) / max(1e-30, sum(s.sum_abs for s in report.quantized))
    console.print(f"kept in high precision: {kept or 'none'}", highlight=False)
    console.print(
        f"overall mean relative error {mean:.4f}; read {format_bytes(report.bytes_in)}, wrote "
        f"{format_bytes(report.bytes_out)} in {report.seconds:.1f} s "
        f"({report.bytes_in / max(report.seconds, 1e-9) / 1e9:.2f} GB/s in) -> {report.destination}",
        highlight=False,
    )
