"""How many spans of one name are open at a moment: requests running (``generate``) or
waiting (``queued``) under the viewer's time cursor. Two sorted arrays and two binary searches."""

from __future__ import annotations

import numpy as np

from rlx.trace.model import Trace


class OpenCount:
    def __init__(self, trace: Trace, name: str) -> None:
        k = trace.name_index(name)
        mine = trace.spans.name == k if k >= 0 else np.zeros(len(trace.spans), bool)
        self.starts = np.sort(trace.spans.start[mine])
        self.ends = np.sort(trace.spans.end[mine])

    def at(self, t: float) -> int:
        """Spans started at or before t and not yet ended."""
        return int(np.searchsorted(self.starts, t, side="right") - np.searchsorted(self.ends, t, side="right"))
