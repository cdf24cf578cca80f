"""Where ``model.build_if_missing`` (and the teacher's) may build: checked in pre-flight before a build starts.

A build is for a path that does not exist yet, on a first run. A mistyped path does not exist either, and
building there would train a fresh model at the typo instead of the one the user has, so a missing path that
nearly names an existing model directory (its first missing part a near miss of a directory beside it:
``warmstrat`` for ``warmstart``, ``modles`` for ``models``) is refused, naming the path meant. Numbered
siblings (``seed1``, ``seed2``) are variants, not typos. A directory that holds files but no ``config.json``
is refused too: the build would replace it. Any other build is announced in one line naming the path and how
to stop it. The build itself is not done here.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.config.errors import ConfigError

if TYPE_CHECKING:
    from rlx.launch.display import Display

NEAR_MISS = 0.8
"""difflib's similarity ratio from which a missing name is taken for a typo of an existing one (``modles`` and
``models``: 0.83); the shipped configs' model directories are at most 0.7 apart."""


def check_build_target(path: str, key: str, build_key: str, build: str, display: Display) -> None:
    """Refuse to build ``build`` at ``path`` (the value of ``key``) where it looks like a typo or would replace
    files; else say what is built where."""
    target = Path(path)
    if target.is_dir() and any(target.iterdir()):
        raise ConfigError(
            f"{key}={path!r} holds files but no config.json, and {build_key}={build} would replace them with a "
            f"new model; point {key} at a model directory (one with config.json), or empty {path} to build there"
        )
    meant = near_miss(target)
    if meant is not None:
        raise ConfigError(
            f"{key}={path!r} does not exist, and {meant} does: a typo? set {key}={meant}; to build a new model "
            f"at {path} instead ({build_key}={build}), create its directory first: mkdir -p {path}"
        )
    display.note(
        f"{key}={path} has no model yet, so {build_key}={build} builds one there; if that path is not the one "
        f"you meant, stop now (Ctrl-C) and fix {key} ({build_key}='' never builds)"
    )


def near_miss(target: Path) -> Path | None:
    """The model directory ``target`` nearly names: its first missing part replaced by a directory beside it
    of a close name, where that makes the path of an existing model; else None."""
    parts = target.parts
    for depth in range(len(parts)):
        here = Path(*parts[: depth + 1])
        if here.exists():
            continue
        staging = (here.name + ".", "." + here.name + ".")  # a killed build's NAME.building, .NAME.tmp-PID
        siblings = [p.name for p in _directories(here.parent) if not p.name.startswith(staging)]
        for name in difflib.get_close_matches(here.name, siblings, n=5, cutoff=NEAR_MISS):
            meant = Path(here.parent, name, *parts[depth + 1 :])
            if _digits(name) == _digits(here.name) and (meant / "config.json").is_file():
                return meant
        return None
    return None


def _directories(parent: Path) -> list[Path]:
    try:
        return [p for p in parent.iterdir() if p.is_dir()]
    except OSError:  # not a directory, or not readable: nothing to compare with
        return []


def _digits(name: str) -> list[str]:
    return re.findall(r"\d+", name)
