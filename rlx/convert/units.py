"""Byte sizes: parse "5GB" / "512MiB" from the command line and print sizes for people."""

from __future__ import annotations

import re

from rlx.convert.errors import ConvertError

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_size(text: str) -> int:
    """'5GB' -> 5_000_000_000, '512MiB' -> 536_870_912, '1000' -> 1000 (bytes)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else None
    if not match or unit not in _UNITS:
        raise ConvertError(f"size {text!r} is not understood; write a number with a unit, e.g. 5GB, 500MB or 2GiB")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ConvertError(f"size {text!r} must be > 0")
    return value


def format_bytes(num_bytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{int(num_bytes)} B"
