"""Names of torch dtypes on the wire, and the allowlist a receiver accepts.

A dtype travels as its torch name without the prefix ("bfloat16"). The receiver looks names up
in this table instead of ``getattr(torch, name)``, so a message cannot name arbitrary objects.
"""

from __future__ import annotations

import torch

_CANDIDATES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
    "bool",
    "complex64",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "uint16",
    "uint32",
    "uint64",
)
DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in _CANDIDATES if isinstance(getattr(torch, name, None), torch.dtype)
}


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype} cannot be synced; supported: {', '.join(DTYPES)}")
    return name


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} in a sync message; supported: {', '.join(DTYPES)}") from None
