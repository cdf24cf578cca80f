"""Where a conversion writes: the checks before it starts, and the atomic temporary directory.

A conversion writes into ``.<name>.tmp-<pid>`` beside the destination and renames it into place
only when every file is written and fsynced, so an interrupted run never leaves a directory that
looks complete; missing parent directories of the destination are created (`out/hf` works on a fresh
clone). An existing destination is refused unless ``--overwrite``, and a destination
that is, contains or lies inside the source is always refused: the source is never modified.

Left out: what is written (the converters).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from rlx.convert.errors import ConvertError
from rlx.formats.checkpoint import fsync_dir


def check_destination(dst: str | Path, source: str | Path, overwrite: bool) -> Path:
    """Validate ``dst`` before any work; return it as a resolved Path."""
    dst, source = Path(dst).resolve(), Path(source).resolve()
    if dst == source or dst in source.parents or source in dst.parents:
        raise ConvertError(
            f"destination {dst} overlaps the source {source}; choose a destination "
            "outside the source (the source is never modified)"
        )
    existing = next(p for p in dst.parents if p.exists())  # missing parents are created when writing starts
    if not existing.is_dir():
        raise ConvertError(f"the destination {dst} lies under {existing}, which is a file; choose another destination")
    if existing != dst.parent and not os.access(existing, os.W_OK | os.X_OK):
        raise ConvertError(f"cannot create {dst.parent}: {existing} is not writable; choose another destination")
    if dst.exists() and not overwrite:
        raise ConvertError(
            f"destination {dst} already exists; pass --overwrite to replace it, or choose a new destination"
        )
    return dst


@contextlib.contextmanager
def staged_directory(dst: Path) -> Iterator[Path]:
    """Yield an empty temporary directory; on success it replaces ``dst``, on failure it is removed."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / f".{dst.name}.tmp-{os.getpid()}"
    _remove(tmp)
    tmp.mkdir()
    try:
        yield tmp
        fsync_dir(tmp)
    except BaseException:
        _remove(tmp)
        raise
    old = dst.parent / f".{dst.name}.old-{os.getpid()}"
    if dst.exists() or dst.is_symlink():
        dst.rename(old)
    tmp.rename(dst)
    fsync_dir(dst.parent)
    _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
