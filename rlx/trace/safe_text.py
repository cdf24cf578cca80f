"""Strings taken from a trace, made safe to show in a terminal.

A trace file may come from anyone (the README promises it is safe to read), so every string
in it -- span and event names, process names, roles and hosts, request ids, attribute keys and
values, error messages, reasons a line was skipped -- goes through ``shown`` before it is drawn:

- control characters (C0 and C1, DEL: ESC starts every ANSI escape sequence), bidi overrides and
  isolates, zero-width and other invisible format characters, line separators and lone
  surrogates become visible escapes (``\\x1b``, ``\\u202e``, ``\\n``), so the text cannot move
  the cursor, retitle the terminal, hide a link or reorder what is read;
- the result is a rich ``Text``, which rich and Textual never parse as markup, so ``[bold]``
  or ``[link=...]`` in a span name is shown as typed. Where a plain ``str`` is drawn (the
  timeline's segments), ``shown(x).plain`` is the same escaped text.

The Perfetto export is JSON for another program, not text for a terminal: its encoder escapes
what JSON needs and the names stay exactly as recorded.
"""

from __future__ import annotations

import re

from rich.style import Style
from rich.text import Text

_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]"
)
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    char = match.group()
    code = ord(char)
    if char in _SHORT:
        return _SHORT[char]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(value: object, style: str | Style = "") -> Text:
    """``str(value)`` as a ``Text`` with no markup and every invisible or controlling character escaped."""
    text = value if isinstance(value, str) else str(value)
    if _UNSAFE.search(text) is not None:
        text = _UNSAFE.sub(_escape, text)
    return Text(text, style=style, end="")
