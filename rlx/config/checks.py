"""The checks every config section runs on its own fields: a value among the allowed choices, in range,
finite. Each raises ``ConfigError`` naming the key and how to fix it."""

from __future__ import annotations

import math
from dataclasses import fields, is_dataclass
from typing import Any

from rlx.config.errors import ConfigError

MIN_TEMPERATURE = 0.01
"""The smallest sampling temperature above 0 (greedy): logits divided by less overflow float range, and the
probabilities come out NaN. vLLM raises a smaller one to this value; rlx refuses it instead, since the trainer
would score the tokens at the temperature asked for. The rollout protocol checks each request against it."""


def check_choice(where: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{where}={value!r} is not allowed; set {where} to one of: {', '.join(choices)}")


def check_range(where: str, value: float, lo: float | None = None, hi: float | None = None, hint: str = "") -> None:
    bounds = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
    check_finite(where, value, bounds)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ConfigError(f"{where}={value!r} must be {bounds}" + (f"; {hint}" if hint else ""))


def check_finite(where: str, value: Any, hint: str = "") -> None:
    """Reject nan and inf (alone or inside a list): every number in a run config is a real value."""
    items = value if isinstance(value, (list, tuple)) else [value]
    bad = [v for v in items if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        shown = f"{where}={value!r}" if items is not value else f"{where} holds {bad[0]!r}, which"
        raise ConfigError(
            f"{shown} is not a finite number (nan and inf are not allowed); set {where} to a "
            f"real value" + (f" {hint}" if hint else "")
        )


def check_all_finite(section: Any, prefix: str = "") -> None:
    """``check_finite`` on every field of a config dataclass and of the sections inside it."""
    for f in fields(section):
        value = getattr(section, f.name)
        if is_dataclass(value):
            check_all_finite(value, f"{prefix}{f.name}.")
        else:
            default = f.default if isinstance(f.default, (int, float)) else None
            check_finite(f"{prefix}{f.name}", value, "" if default is None else f"(default {default!r})")
