"""The trace file format: one JSON object per line, one file per process.

A file is ``<trace_dir>/<name>.<pid>.jsonl``. Its first line is a header; every later line is a
span, a span begin or end, or an instant event, tagged by the ``k`` field:

- ``H`` header: ``format="rlx-trace"``, ``version``, process ``name``, ``role``, ``pid``,
  ``host``, and the clocks read together at start: ``wall_ns`` (Unix time) and ``mono_ns``
  (CLOCK_MONOTONIC). All later timestamps ``t`` are nanoseconds of the monotonic clock since
  ``mono_ns``, so a process's events never jump with NTP, and ``wall_ns + t`` places them on one
  timeline with every other process (exact on one host, as good as NTP across hosts).
- ``X`` complete span, written when a span ends: span id ``i`` (unique in the file), name
  ``n``, start ``t``, duration ``d`` (ns), parent span id ``p`` (0 = none), request id ``r``
  (hoisted out of the attributes so that the viewer can put the span on a per-request lane
  without decoding them), attributes ``a`` (given at start and added by ``span.set``), and
  ``err`` (``"ExcType: message"``) when it exited with an exception.
- ``B`` span begin, written only for a span still open after the tracer's
  ``open_span_flush_s``: ``i``, ``n``, ``t``, ``p``, ``r``, ``a``. Such a span ends with
- ``E`` span end: ``i``, ``t``, ``r`` (if set only at the end), the attributes added by
  ``span.set`` in ``a``, and ``err``. A ``B`` without an end is a span that never ended (a
  crash, a hang): the viewer draws it as unfinished. A ``B`` and an ``X`` with one id (the
  begin line raced with the end) are one finished span.
- ``I`` instant event: ``n``, ``t``, enclosing span ``p``, ``r``, ``a``.

Absent optional fields are omitted. Record structs are ``gc=False`` (they hold no cycles), which
halves the time to decode a million of them. This module holds only the record types and their
codecs; writing is in ``tracer.py``, reading in ``reader.py`` and ``loader.py``. No pickle:
records are plain JSON, safe to read from anyone.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

FORMAT_NAME = "rlx-trace"
FORMAT_VERSION = 1
REQUEST_KEY = "request_id"


Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""Ids and times fit numpy's int64 columns; a line with a larger number is skipped, not fatal."""

NO_ATTRS = msgspec.Raw()
"""The ``a`` of a record without attributes (omitted when written). Writers put a dict in ``a``;
readers get the attributes as undecoded JSON (``msgspec.Raw``), decoded only when shown."""


class Header(msgspec.Struct, tag="H", tag_field="k", kw_only=True):
    format: str
    version: int
    name: str
    role: str
    pid: int
    host: str
    wall_ns: Int64
    mono_ns: Int64


class Begin(msgspec.Struct, tag="B", tag_field="k", kw_only=True, omit_defaults=True, gc=False):
    i: Int64
    n: str
    t: Int64
    p: Int64 = 0
    r: str | int | None = None
    a: msgspec.Raw = NO_ATTRS


class Complete(msgspec.Struct, tag="X", tag_field="k", kw_only=True, omit_defaults=True, gc=False):
    i: Int64
    n: str
    t: Int64
    d: Int64
    p: Int64 = 0
    r: str | int | None = None
    a: msgspec.Raw = NO_ATTRS
    err: str | None = None


class End(msgspec.Struct, tag="E", tag_field="k", kw_only=True, omit_defaults=True, gc=False):
    i: Int64
    t: Int64
    r: str | int | None = None
    a: msgspec.Raw = NO_ATTRS
    err: str | None = None


class Instant(msgspec.Struct, tag="I", tag_field="k", kw_only=True, omit_defaults=True, gc=False):
    n: str
    t: Int64
    p: Int64 = 0
    r: str | int | None = None
    a: msgspec.Raw = NO_ATTRS


Record = Complete | Begin | End | Instant


def _to_json_safe(obj: object) -> object:
    """Encode what JSON cannot (numpy scalars, tensors, paths) as a number or its str()."""
    item = getattr(obj, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(obj)


encoder = msgspec.json.Encoder(enc_hook=_to_json_safe)
header_decoder = msgspec.json.Decoder(Header)
record_decoder = msgspec.json.Decoder(Record)
records_decoder = msgspec.json.Decoder(list[Record])
attrs_decoder = msgspec.json.Decoder(dict)


def decode_attrs(raw: msgspec.Raw | bytes | None) -> dict:
    """The attribute dict of a record (empty when it had none or they do not decode)."""
    if raw is None or raw is NO_ATTRS:
        return {}
    try:
        value = attrs_decoder.decode(raw)
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}
