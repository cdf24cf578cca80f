"""The conversion plan that ``--dry-run`` prints: every output tensor, where it comes from, its
bytes and its file, plus the totals and the memory the conversion will need.

Layers repeat, so the mapping table shows each distinct name pattern once (layer index as
``{i}``) with a count; the totals cover every tensor. Left out: executing the plan (the converters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from rlx.convert.units import format_bytes


@dataclass(frozen=True)
class PlanRow:
    name: str
    sources: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    file: str


@dataclass
class Plan:
    title: str
    source: str
    destination: str
    rows: list[PlanRow]
    bytes_in: int
    peak_memory_bytes: int
    notes: list[str] = field(default_factory=list)

    @property
    def bytes_out(self) -> int:
        return sum(r.nbytes for r in self.rows)

    @property
    def files(self) -> list[str]:
        return sorted({r.file for r in self.rows})


def _pattern(name: str) -> str:
    return re.sub(r"\.\d+\.", ".{i}.", name)


def render_plan(plan: Plan, console: Console) -> None:
    summary = Table(title=plan.title, show_header=False)
    for key, value in (
        ("source", plan.source),
        ("destination", plan.destination),
        ("tensors", str(len(plan.rows))),
        ("bytes read", format_bytes(plan.bytes_in)),
        ("bytes written", format_bytes(plan.bytes_out)),
        ("files", str(len(plan.files))),
        ("peak memory (est.)", format_bytes(plan.peak_memory_bytes)),
    ):
        summary.add_row(key, value)
    console.print(summary)
    console.print("[bold]mapping[/] (one entry per name pattern; {i} = layer index)")
    for line in mapping_lines(plan):
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    for note in plan.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)


def mapping_lines(plan: Plan) -> list[str]:
    """Two lines per distinct name pattern: 'output <- sources' and its shape, dtype, bytes, count, file."""
    groups: dict[str, list] = {}
    for row in plan.rows:
        key = _pattern(row.name)
        if key not in groups:
            groups[key] = [row, 0, 0, set()]
        groups[key][1] += 1
        groups[key][2] += row.nbytes
        groups[key][3].add(row.file)
    lines = []
    for key, (row, count, nbytes, files) in groups.items():
        sources = ", ".join(_pattern(s) for s in row.sources)
        arrow = f"  <-  {sources}" if sources and sources != key else ""
        where = next(iter(files)) if len(files) == 1 else f"{len(files)} files"
        lines.append(f"  {key}{arrow}")
        lines.append(
            f"      {list(row.shape)} {row.dtype}, {format_bytes(nbytes)} in {count} tensor"
            f"{'s' if count > 1 else ''}, {where}"
        )
    return lines
