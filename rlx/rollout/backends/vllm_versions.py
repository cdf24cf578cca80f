"""Per-token policy versions on a vLLM engine that does not label its outputs.

Newer vLLMs label every engine step with a weight version (``AsyncLLM.update_weight_version``) and hand
the spans back on the final output (``CompletionOutput.weight_versions``); vLLM 0.25 has neither. There
the backend counts instead: the label only changes while the engine is paused (``keep`` mode returns once
the engine is idle and has sent the outputs of every step it ran) or asleep, so the tokens a request holds
at a change are exactly the tokens sampled under the old label. ``CountedVersions`` records, at every
change, each live request's token count (``Mark``), and turns a finished request's marks into one version
per token.

"Holds" means: after the engine's output handler has processed every output the engine sent before the
pause (``settle``). vLLM reads the engine's socket in one task and queues step outputs for the output
handler, while a pause's reply resolves at once; so the queue is drained before the counts are read.

Left out: the engine-labelled path (``vllm.py``), and what versions mean to the trainer.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

SETTLE_TIMEOUT_S = 10.0  # the longest ``settle`` waits for vLLM's output handler; it takes milliseconds


@dataclass
class _Request:
    """The marks of one request's samples: child index -> [(token count, version from that token on)]."""

    n: int
    marks: dict[int, list[tuple[int, int]]] = field(default_factory=dict)


class CountedVersions:
    """Versions of the tokens of the requests of one engine, counted at each label change."""

    def __init__(self, version: int = 0) -> None:
        self.version = version
        self._requests: dict[str, _Request] = {}

    def start(self, request_id: str, n: int) -> None:
        """A request of ``n`` samples enters the engine: its first tokens carry the current label."""
        self._requests[request_id] = _Request(n, {i: [(0, self.version)] for i in range(n)})

    def relabel(self, version: int, states: dict) -> None:
        """The label becomes ``version``; ``states``: the engine's output processor's request states (settled).
        A sample not yet in the engine has no token: its next token carries the new label."""
        self.version = version
        counts = {(s.external_req_id, s.request_index): _num_tokens(s) for s in states.values()}
        for request_id, request in self._requests.items():
            for index, marks in request.marks.items():
                marks.append((counts.get((request_id, index), 0), version))

    def finish(self, request_id: str, index: int, num_tokens: int) -> list[int]:
        """The version of each of the ``num_tokens`` tokens of sample ``index``."""
        request = self._requests[request_id]
        marks = request.marks.pop(index, [(0, self.version)])
        if not request.marks:
            del self._requests[request_id]
        return versions_from_marks(marks, num_tokens)

    def drop(self, request_id: str) -> None:
        """A request that ended without a result (aborted, failed)."""
        self._requests.pop(request_id, None)


def versions_from_marks(marks: list[tuple[int, int]], num_tokens: int) -> list[int]:
    """Token ``t`` carries the version of the last mark at or before it (a later mark at the same count wins:
    the label changed twice while the sample made no token)."""
    counts = [count for count, _ in marks]
    return [marks[bisect.bisect_right(counts, t) - 1][1] for t in range(num_tokens)]


async def settle(engine) -> None:
    """Until vLLM's output handler has processed every output queued for it and waits for the next: the
    handler blocks in the queue's ``get`` exactly when it has nothing left."""
    queue = getattr(engine.engine_core, "outputs_queue", None)
    if not isinstance(queue, asyncio.Queue) or getattr(engine, "output_handler", None) is None:
        return  # no request has run yet: nothing to wait for
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not (queue.empty() and getattr(queue, "_getters", None)):
        if time.monotonic() > deadline:
            log.warning(
                "vLLM's output handler did not settle within %.0f s; token versions counted now may "
                "place the version change a few tokens late",
                SETTLE_TIMEOUT_S,
            )
            return
        await asyncio.sleep(0.0005)


def _num_tokens(state) -> int:
    detokenizer = getattr(state, "detokenizer", None)
    if detokenizer is not None:
        return detokenizer.num_output_tokens()
    return len(state.logprobs_processor.logprobs or [])
