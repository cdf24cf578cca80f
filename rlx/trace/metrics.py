"""Reading a run's ``metrics.jsonl`` (one JSON object per step) for the viewer's Metrics tab.

Each line is ``{"step": 3, "reward_mean": 0.41, ...}``; every key but ``step`` is optional on
any line (``eval_accuracy`` appears only on eval steps). A line that is not a JSON object with an
integer ``step`` is skipped and counted, never fatal. Writing metrics is not done here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec

_decoder = msgspec.json.Decoder(dict)
MAX_LINE_BYTES = 1 << 20
"""A step's metrics are a few hundred bytes; a longer line is a damaged file, not a row."""


@dataclass
class Metrics:
    path: Path
    rows: list[dict] = field(default_factory=list)
    skipped: int = 0

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the lines that carry a number under ``key``."""
        pairs = [
            (row["step"], float(row[key]))
            for row in self.rows
            if isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool)
        ]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def keys(self) -> list[str]:
        return sorted({k for row in self.rows for k in row} - {"step"})


def find_metrics_file(trace_path: str | Path) -> Path | None:
    """``metrics.jsonl`` of the run a trace belongs to: next to the trace dir, or in a run dir."""
    path = Path(trace_path)
    trace_dir = path.parent if path.is_file() else path
    for candidate in (trace_dir / "metrics.jsonl", trace_dir.parent / "metrics.jsonl"):
        if candidate.is_file():
            return candidate
    return None


def load_metrics(path: str | Path) -> Metrics:
    """Every usable line of a metrics file; FileNotFoundError names a missing one, ValueError
    (naming file and line) a line longer than ``MAX_LINE_BYTES``. Read a line at a time."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}; pass --metrics PATH to a run's metrics.jsonl")
    metrics = Metrics(path=path)
    with open(path, "rb") as f:
        for line_no, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(line) > MAX_LINE_BYTES:
                raise ValueError(
                    f"{path}:{line_no}: a line longer than {MAX_LINE_BYTES >> 20} MiB is no "
                    f"metrics row; pass --metrics PATH to a run's metrics.jsonl"
                )
            if line.strip():
                _add_row(metrics, line)
    return metrics


def _add_row(metrics: Metrics, line: bytes) -> None:
    try:
        row = _decoder.decode(line)
    except msgspec.DecodeError:
        metrics.skipped += 1
        return
    if isinstance(row.get("step"), int) and not isinstance(row.get("step"), bool):
        metrics.rows.append(row)
    else:
        metrics.skipped += 1
