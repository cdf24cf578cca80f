"""A rich progress bar counted in bytes, safe to advance from worker threads."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn


@contextlib.contextmanager
def byte_progress(
    description: str, total_bytes: int, console: Console | None = None, enabled: bool = True
) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(num_bytes)``; the bar shows bytes done, speed and time left."""
    if not enabled:
        yield lambda num_bytes: None
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=total_bytes)
        yield lambda num_bytes: progress.advance(task, num_bytes)
