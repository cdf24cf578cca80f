"""The terminal trace viewer (Textual). Importing this package imports Textual; the CLI does it
only inside the ``trace-view`` command, so ``rlx --help`` stays light."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rlx.trace.viewer.app import TraceViewerApp

__all__ = ["TraceViewerApp", "save_screenshot"]


def save_screenshot(app: TraceViewerApp, out: str | Path, size: tuple[int, int] = (160, 48)) -> Path:
    """Run the app headless at ``size`` (columns, rows) and save Textual's SVG of its first screen."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)

    async def shoot() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            out.write_text(app.export_screenshot(title=app.TITLE), encoding="utf-8")

    asyncio.run(shoot())
    return out
