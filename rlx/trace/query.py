"""Filters over a loaded trace: which spans and events match a short text query.

A query is whitespace-separated terms, all of which must hold:

- ``gen`` - the name contains ``gen`` (case-insensitive);
- ``name=generate`` - the name is exactly ``generate``;
- ``finish_reason=length``, ``bucket_id=3`` - an attribute equals the value (numbers compare as
  numbers); ``completion_tokens>=200`` - ``> < >= <=`` compare numerically;
- special keys: ``dur>10ms`` (duration, any unit of ``units.parse_duration_ns``), ``proc=rollout0``
  (process name), ``role=trainer``, ``request_id=req-7`` (own or inherited request),
  ``status=error|unfinished|ok``.

Names, durations and processes are vectorised numpy; attributes are decoded only for records
whose raw JSON contains the key. Events match name, process, request and attribute terms; a
duration or status term matches no event.
"""

from __future__ import annotations

import difflib
import operator
import re
from dataclasses import dataclass

import numpy as np

from rlx.trace.format import NO_ATTRS, decode_attrs
from rlx.trace.model import STATUS_ERROR, STATUS_OK, STATUS_UNFINISHED, Trace
from rlx.trace.safe_text import shown
from rlx.trace.units import parse_duration_ns

_TERM = re.compile(r"^([A-Za-z_][\w.\-]*)\s*(>=|<=|!=|=|>|<)\s*(.+)$")
_OPS = {"=": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le}
_STATUS = {"ok": STATUS_OK, "error": STATUS_ERROR, "unfinished": STATUS_UNFINISHED}


@dataclass
class Term:
    key: str
    op: str
    value: str


def parse_query(text: str) -> list[Term]:
    """Terms of a query; a bare word is ``Term('', 'contains', word)``. ValueError on bad terms."""
    terms = []
    for word in text.split():
        match = _TERM.match(word)
        if match:
            terms.append(Term(*match.groups()))
        elif any(op in word for op in "=<>"):
            raise ValueError(f"cannot read filter term {word!r}; write key=value, key>number or a name")
        else:
            terms.append(Term("", "contains", word))
    for term in terms:
        _check(term)
    return terms


def _check(term: Term) -> None:
    if term.key == "dur":
        if term.op in ("=", "!="):
            raise ValueError(f"dur{term.op}{term.value}: compare durations with > < >= <=, e.g. dur>10ms")
        parse_duration_ns(term.value)
    if term.key == "status" and term.value not in _STATUS:
        raise ValueError(f"status={term.value!r}: use one of {', '.join(_STATUS)}")


SPECIAL_KEYS = ("name", "proc", "process", "role", "request_id", "dur", "status")


def check_keys(trace: Trace, terms: list[Term]) -> None:
    """ValueError naming a term's key that neither is a special key nor an attribute of any span or event of
    ``trace``: a misspelled key (``rol=trainer``) would match nothing, silently."""
    for term in terms:
        if term.key and term.key not in SPECIAL_KEYS and not _has_attribute(trace, term.key):
            known = attribute_keys(trace)
            close = difflib.get_close_matches(term.key, [*SPECIAL_KEYS, *known], n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"{term.key}{term.op}{term.value}: no span or event of this trace has {term.key!r}; "
                f"{hint}keys: {', '.join(SPECIAL_KEYS)}, and the attributes "
                f"{', '.join(known) or '(none)'}"
            )


def _attribute_columns(trace: Trace) -> list:
    return [trace.spans.begin_attrs, trace.spans.end_attrs.attrs, trace.events.attrs]


def _has_attribute(trace: Trace, key: str) -> bool:
    needle = f'"{key}":'.encode()
    for raws in _attribute_columns(trace):
        candidates = raws.candidates(needle) if hasattr(raws, "candidates") else range(len(raws))
        if any(key in decode_attrs(raws[k]) for k in candidates):
            return True
    return False


def attribute_keys(trace: Trace, sample: int = 20_000) -> list[str]:
    """Attribute keys of the trace, from the first ``sample`` records of each attribute column (for messages)."""
    keys: set[str] = set()
    for raws in _attribute_columns(trace):
        for k in range(min(len(raws), sample)):
            if raws[k] is not NO_ATTRS:
                keys.update(decode_attrs(raws[k]))
    return sorted(keys)


def match_spans(trace: Trace, text: str) -> np.ndarray:
    """Boolean mask over trace.spans of the spans matching every term of the query; ValueError for a term that
    cannot be read or names a key the trace does not have."""
    spans = trace.spans
    mask = np.ones(len(spans), bool)
    terms = parse_query(text)
    check_keys(trace, terms)
    for term in terms:
        if term.key == "dur":
            mask &= _OPS[term.op](spans.duration, parse_duration_ns(term.value))
        elif term.key == "status":
            mask &= _OPS[term.op](spans.status, _STATUS[term.value])
        else:
            mask &= _common(
                trace,
                term,
                spans.name,
                spans.proc,
                spans.request,
                [(spans.begin_attrs, None), (spans.end_attrs.attrs, spans.end_attrs.owner)],
                len(spans),
            )
    return mask


def match_events(trace: Trace, text: str) -> np.ndarray:
    """Boolean mask over trace.events of the instant events matching every term."""
    events = trace.events
    mask = np.ones(len(events), bool)
    for term in parse_query(text):
        if term.key in ("dur", "status"):
            mask[:] = False
        else:
            mask &= _common(trace, term, events.name, events.proc, events.request, [(events.attrs, None)], len(events))
    return mask


def _common(
    trace: Trace, term: Term, names: np.ndarray, procs: np.ndarray, requests: np.ndarray, raw_lists: list, n: int
) -> np.ndarray:
    if term.op == "contains":
        wanted = [k for k, name in enumerate(trace.names) if term.value.lower() in name.lower()]
        return np.isin(names, wanted)
    if term.key == "name":
        return _by_label(names, trace.names, term)
    if term.key in ("proc", "process"):
        return _by_label(procs, [p.name for p in trace.processes], term)
    if term.key == "role":
        return _by_label(procs, [p.role for p in trace.processes], term)
    if term.key == "request_id":
        return _by_label(requests, [str(r) for r in trace.request_ids], term, missing=-1)
    return _by_attribute(term, raw_lists, n)


def _by_label(column: np.ndarray, labels: list[str], term: Term, missing: int | None = None) -> np.ndarray:
    wanted = [k for k, label in enumerate(labels) if _label_matches(label, term)]
    if missing is not None and term.op == "!=":
        wanted.append(missing)
    return np.isin(column, wanted)


def _label_matches(label: str, term: Term) -> bool:
    """The label compares true as recorded or as the viewer shows it (``safe_text.shown``)."""
    forms = (label,) if label.isprintable() else (label, shown(label).plain)
    if term.op == "!=":
        return all(_compare(form, term.op, term.value) for form in forms)
    return any(_compare(form, term.op, term.value) for form in forms)


def _by_attribute(term: Term, raw_lists: list, n: int) -> np.ndarray:
    """Records whose attribute ``term.key`` compares true; ``raw_lists`` are (raws, owner map)."""
    needle = f'"{term.key}":'.encode()
    plain = term.op == "=" and _as_number(term.value) is None
    value = term.value.encode() if plain else b""  # an equal string appears in the JSON text
    mask = np.zeros(n, bool)
    for raws, owner in raw_lists:
        candidates = (
            raws.candidates(needle, value)
            if hasattr(raws, "candidates")
            else [
                k
                for k, raw in enumerate(raws)
                if raw is not NO_ATTRS and needle in (text := bytes(raw)) and value in text
            ]
        )
        for k in candidates:
            attrs = decode_attrs(raws[k])
            if term.key in attrs and _compare(attrs[term.key], term.op, term.value):
                i = k if owner is None else int(owner[k])
                if i >= 0:
                    mask[i] = True
    return mask


def _compare(actual: object, op: str, wanted: str) -> bool:
    number = _as_number(wanted)
    if number is not None and isinstance(actual, (int, float)) and not isinstance(actual, bool):
        return _OPS[op](actual, number)
    if op in ("=", "!="):
        return _OPS[op](_as_text(actual), wanted)
    return False


def _as_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _as_text(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
