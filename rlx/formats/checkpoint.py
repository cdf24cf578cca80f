"""On-disk format of an rlx trainer checkpoint, and its integrity check.

A checkpoint is a directory ``<run_dir>/checkpoints/step_00000010/``::

    manifest.json            written last; lists every file with its size and sha256
    model*.safetensors       full (unsharded) weights with Hugging Face parameter names
    adapter_model.safetensors, adapter_config.json
                             instead of model*.safetensors for a LoRA run: the adapter in PEFT's format
    optimizer.safetensors    AdamW state, keys "<param>.exp_avg", "<param>.exp_avg_sq", "<param>.step"
    trainer_state.json       step, data position, scheduler, RNG states, config
    (files of checkpoint plugins, when they write any; listed in the manifest like the rest)
    hf/                      config.json, generation_config.json and tokenizer files of the model

It is written into a temporary sibling directory, fsynced and renamed, so a directory named
``step_*`` is either complete or was tampered with afterwards; ``verify_checkpoint`` tells.
No pickle anywhere: tensors are safetensors, the rest JSON. This module leaves out writing
tensors (``rlx.trainer.checkpoint``) and conversion (``rlx.convert``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from rlx.formats.hf_dir import read_json_object

FORMAT = "rlx-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
STEP_PREFIX = "step_"
ADAPTER_FILE, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"


class CorruptCheckpoint(ValueError):
    """A checkpoint directory that is partial, truncated or altered; it must not be loaded."""


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def file_digest(path: Path, chunk_bytes: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(ckpt_dir: Path, step: int, model_files: list[str], extra: dict[str, Any]) -> None:
    """Record every file under ``ckpt_dir`` (size + sha256) and fsync; call it last."""
    files = {}
    for path in sorted(p for p in ckpt_dir.rglob("*") if p.is_file() and p.name != MANIFEST):
        rel = path.relative_to(ckpt_dir).as_posix()
        files[rel] = {"bytes": path.stat().st_size, "sha256": file_digest(path)}
    manifest = {"format": FORMAT, "version": VERSION, "step": step, "model_files": model_files, "files": files, **extra}
    target = ckpt_dir / MANIFEST
    with open(target, "w") as f:
        json.dump(manifest, f, indent=2)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a rename or new entry in ``path`` durable (the directory's own metadata)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


MAX_MANIFEST_BYTES = 256 << 20


def read_manifest(ckpt_dir: Path) -> dict[str, Any]:
    path = Path(ckpt_dir) / MANIFEST
    if not path.is_file():
        raise CorruptCheckpoint(
            f"{ckpt_dir} has no {MANIFEST}: it is partial (a save was interrupted) or not an rlx checkpoint"
        )
    # a manifest lists files: KiBs, even for thousands of shards
    manifest = read_json_object(path, "a manifest", "the checkpoint is corrupt", MAX_MANIFEST_BYTES, CorruptCheckpoint)
    if manifest.get("format") != FORMAT:
        raise CorruptCheckpoint(f"{path} is not an rlx checkpoint manifest (format={manifest.get('format')!r})")
    if manifest.get("version") != VERSION:
        raise CorruptCheckpoint(f"{path} has format version {manifest.get('version')}; this rlx reads {VERSION}")
    if not isinstance(manifest.get("step"), int) or isinstance(manifest["step"], bool):
        raise CorruptCheckpoint(
            f"{path} has step={manifest.get('step')!r}, not a step number; the checkpoint is corrupt"
        )
    return manifest


def verify_checkpoint(ckpt_dir: str | Path, check_hashes: bool = True) -> dict[str, Any]:
    """Return the manifest if every listed file is present with its size (and hash); else raise."""
    ckpt_dir = Path(ckpt_dir)
    manifest = read_manifest(ckpt_dir)
    _check_listing(ckpt_dir, manifest)
    for rel, info in manifest["files"].items():
        path = ckpt_dir / rel
        if not path.is_file():
            raise CorruptCheckpoint(f"{ckpt_dir}: {rel} is listed in the manifest but missing")
        size = path.stat().st_size
        if size != info["bytes"]:
            raise CorruptCheckpoint(
                f"{ckpt_dir}: {rel} has {size} bytes, the manifest says {info['bytes']} (truncated or overwritten)"
            )
        if check_hashes and file_digest(path) != info["sha256"]:
            raise CorruptCheckpoint(f"{ckpt_dir}: {rel} does not match its sha256 in the manifest (corrupt)")
    return manifest


def _check_listing(ckpt_dir: Path, manifest: dict[str, Any]) -> None:
    """The manifest's file list is well formed, inside the checkpoint, and names every model file."""
    files, model_files = manifest.get("files"), manifest.get("model_files")
    if not isinstance(files, dict) or not files:
        raise CorruptCheckpoint(f"{ckpt_dir / MANIFEST} lists no files; the checkpoint is corrupt")
    for rel, info in files.items():
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise CorruptCheckpoint(f"{ckpt_dir / MANIFEST} lists {rel!r}, a path outside the checkpoint")
        if not (isinstance(info, dict) and isinstance(info.get("bytes"), int) and isinstance(info.get("sha256"), str)):
            raise CorruptCheckpoint(
                f"{ckpt_dir / MANIFEST}: the entry of {rel!r} is {info!r}, not "
                "{'bytes': ..., 'sha256': ...}; the checkpoint is corrupt"
            )
    if not isinstance(model_files, list) or not model_files or not all(isinstance(n, str) for n in model_files):
        raise CorruptCheckpoint(f"{ckpt_dir / MANIFEST} lists no model_files; the checkpoint holds no weights")
    unlisted = [name for name in model_files if name not in files]
    if unlisted:
        raise CorruptCheckpoint(
            f"{ckpt_dir / MANIFEST} names model file {unlisted[0]!r} but does not list it "
            "among its files; the checkpoint is corrupt"
        )


def list_checkpoints(checkpoints_dir: str | Path) -> list[Path]:
    """Directories named step_* in step order (complete or not; verify before loading)."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    dirs = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX)]
    return sorted(dirs, key=lambda p: int(p.name[len(STEP_PREFIX) :]) if p.name[len(STEP_PREFIX) :].isdigit() else -1)
