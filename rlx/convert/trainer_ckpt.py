"""Find and verify the rlx trainer checkpoint to convert (format: ``rlx.formats.checkpoint``).

Accepts a step directory (``.../checkpoints/step_00000010``), a ``checkpoints/`` directory or a
run directory. For the last two the newest checkpoint that passes ``verify_checkpoint`` (sizes
and sha256 of every file) is taken, and the corrupt or partial ones skipped on the way are
reported. A step directory that fails verification is refused with the verifier's message.

Left out: the optimizer and trainer state (conversion exports the model only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rlx.convert.errors import ConvertError
from rlx.convert.hf_write import read_model_config
from rlx.formats.checkpoint import MANIFEST, STEP_PREFIX, CorruptCheckpoint, list_checkpoints, verify_checkpoint

HF_SUBDIR = "hf"


@dataclass
class TrainerCheckpoint:
    path: Path
    step: int
    model_files: list[str]
    skipped: list[str] = field(default_factory=list)

    @property
    def hf_dir(self) -> Path:
        return self.path / HF_SUBDIR


def is_trainer_checkpoint(path: Path) -> bool:
    if (path / MANIFEST).is_file() or path.name.startswith(STEP_PREFIX):
        return True
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    return bool(list_checkpoints(root))


def resolve_trainer_checkpoint(path: str | Path) -> TrainerCheckpoint:
    path = Path(path)
    if (path / MANIFEST).is_file() or path.name.startswith(STEP_PREFIX):
        return _verified(path, [])
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    candidates = list_checkpoints(root)
    if not candidates:
        raise ConvertError(
            f"{path} holds no step_* checkpoints; pass a run directory, its checkpoints/ "
            "directory or one step_* directory"
        )
    skipped: list[str] = []
    for ckpt in reversed(candidates):
        try:
            manifest = _checked_manifest(ckpt)
        except CorruptCheckpoint as exc:
            skipped.append(str(exc))
            continue
        return _trainer_checkpoint(ckpt, manifest, skipped)
    raise ConvertError(
        f"no complete checkpoint in {root}; every one is corrupt or partial ({'; '.join(skipped)}); "
        "pass a step_* directory from a copy of the run"
    )


def _verified(ckpt: Path, skipped: list[str]) -> TrainerCheckpoint:
    try:
        manifest = _checked_manifest(ckpt)
    except CorruptCheckpoint as exc:
        raise ConvertError(
            f"refusing to convert a corrupt or partial checkpoint: {exc}. Pass an earlier "
            "step_* directory, or the run directory to take the newest complete one"
        ) from None
    return _trainer_checkpoint(ckpt, manifest, skipped)


def _checked_manifest(ckpt: Path) -> dict:
    manifest = verify_checkpoint(ckpt)
    if not (ckpt / HF_SUBDIR / "config.json").is_file():
        raise CorruptCheckpoint(f"{ckpt} has no {HF_SUBDIR}/config.json; it was not written by the rlx trainer")
    return manifest


def _trainer_checkpoint(ckpt: Path, manifest: dict, skipped: list[str]) -> TrainerCheckpoint:
    read_model_config(ckpt / HF_SUBDIR)
    return TrainerCheckpoint(ckpt, manifest["step"], list(manifest["model_files"]), skipped)


def check_lm_head(ckpt: TrainerCheckpoint, names: set[str]) -> None:
    config = read_model_config(ckpt.hf_dir)
    if not config.get("tie_word_embeddings", False) and "lm_head.weight" not in names:
        raise ConvertError(
            f"{ckpt.path} has no lm_head.weight but its config says tie_word_embeddings="
            "false; the checkpoint is incomplete"
        )
