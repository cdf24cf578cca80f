"""Tracing: spans and instant events of every rlx process, written as JSON lines.

``from rlx.trace import tracer`` gives the process-wide tracer (off until configured; see
``tracer.py``). The file format is in ``format.py``; reading, summarising and exporting traces
live in ``loader.py`` (with ``columnar.py``, its pyarrow fast path, and ``cache.py``, the columns
of traces opened before), ``summary.py`` and ``perfetto.py``; the terminal viewer in ``viewer/``.
Every string from a trace is shown through ``safe_text.shown``. ``synthetic.py`` and
``replicate.py`` write large traces for tests and benchmarks.
Importing this package imports only msgspec, never numpy, textual or torch.
"""

from rlx.trace.tracer import ENV_TRACE_DIR, NOOP_SPAN, Span, Tracer, tracer

__all__ = ["ENV_TRACE_DIR", "NOOP_SPAN", "Span", "Tracer", "tracer"]
