"""``convert-ckpt`` as a library call: detect what the source is and build the conversion job.

Sources: an rlx trainer checkpoint (step dir, checkpoints/ dir or run dir), a Hugging Face
directory, a Megatron torch_dist checkpoint, or a GGUF file (imported as a Hugging Face directory,
``rlx.convert.gguf_import``). Targets: ``hf``, ``torch_dist``, or ``peft`` (the
default for a LoRA run's checkpoint, which holds only the adapter). Every job has ``plan(dst)``
(for --dry-run) and ``run(dst)``; the CLI checks the destination first.

Left out: printing (``rlx.cli.convert_ckpt``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlx.convert.errors import ConvertError
from rlx.convert.hf_job import hf_to_hf_job, trainer_to_hf_job
from rlx.convert.hf_write import parse_dtype, read_model_config
from rlx.convert.megatron import require_megatron
from rlx.convert.megatron.layout import is_torch_dist
from rlx.convert.safetensors_io import INDEX_NAME, SafetensorsDir
from rlx.convert.trainer_ckpt import is_trainer_checkpoint, resolve_trainer_checkpoint

TARGETS = ("hf", "torch_dist", "peft")


@dataclass
class ConvertOptions:
    to: str | None = None
    dtype: str = "auto"
    shard_bytes: int = 5 * 10**9
    workers: int = 2
    hf_config: Path | None = None
    iteration: int | None = None
    vocab_multiple: int = 128

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConvertError(f"--workers {self.workers} must be >= 1 (shards written in parallel)")
        if self.iteration is not None and self.iteration < 0:
            raise ConvertError(f"--iteration {self.iteration} must be >= 0 (a Megatron iteration number)")


def detect_source(src: Path) -> str:
    if not src.exists():
        raise ConvertError(f"source {src} does not exist")
    if not src.is_dir():
        from rlx.convert.gguf_import import is_gguf

        if is_gguf(src):
            return "gguf"
        raise ConvertError(
            f"source {src} is a file; pass the directory that holds the checkpoint, or a GGUF "
            "file (it does not start with the GGUF magic bytes)"
        )
    if is_torch_dist(src):
        return "torch_dist"
    if (src / "manifest.json").is_file() or (not (src / "config.json").is_file() and is_trainer_checkpoint(src)):
        return "trainer"
    if (src / "config.json").is_file() and ((src / INDEX_NAME).is_file() or any(src.glob("*.safetensors"))):
        return "hf"
    if (src / "config.json").is_file():
        SafetensorsDir(src)  # raises with the reason (no weights, pickle weights...)
    if (src / INDEX_NAME).is_file() or any(src.glob("*.safetensors")):
        raise ConvertError(
            f"{src} holds safetensors weights but no config.json; copy the model's config.json "
            "(and tokenizer files) into it: the output needs them to load"
        )
    raise ConvertError(
        f"cannot tell what {src} is: expected an rlx trainer checkpoint (manifest.json or "
        "step_* directories), a Hugging Face directory (config.json + *.safetensors) or a "
        "Megatron torch_dist checkpoint (latest_checkpointed_iteration.txt or iter_*/metadata.json)"
    )


def build_job(src: Path, options: ConvertOptions):
    kind = detect_source(src)
    if kind == "torch_dist" or options.to == "torch_dist":
        require_megatron(f"converting {src} from torch_dist" if kind == "torch_dist" else "--to torch_dist")
    if kind == "trainer":
        return _from_trainer(resolve_trainer_checkpoint(src), options)
    if kind == "gguf":
        return _from_gguf(src, options)
    to = options.to or ("hf" if kind != "hf" else None)
    if to is None:
        raise ConvertError(
            f"{src} is already a Hugging Face directory: pass --to torch_dist to convert it for "
            "Megatron, or --to hf to re-shard / cast it"
        )
    _check_target(to)
    if to == "peft":
        raise ConvertError(
            f"--to peft exports the adapter of a LoRA trainer checkpoint; {src} is a {kind} "
            "checkpoint, convert it with --to hf or --to torch_dist"
        )
    dtype = parse_dtype(options.dtype)
    if kind == "torch_dist":
        return _from_torch_dist(src, to, dtype, options)
    read_model_config(src)  # a broken config fails here, before the destination is touched
    if to == "hf":
        return hf_to_hf_job(src, dtype, options.shard_bytes, options.workers)
    return _to_torch_dist(SafetensorsDir(src), src, dtype, options, [])


def _check_target(to: str) -> None:
    if to not in TARGETS:
        raise ConvertError(f"--to {to} is not a target; use one of {', '.join(TARGETS)}")


def _from_gguf(src: Path, options: ConvertOptions):
    from rlx.convert.gguf_import import GgufJob, check_gguf

    if options.to not in (None, "hf"):
        raise ConvertError(
            f"--to {options.to}: a GGUF file is imported as a Hugging Face directory; leave out --to "
            "(or pass --to hf), then convert that directory further"
        )
    check_gguf(src)
    parse_dtype(options.dtype)
    return GgufJob(src, options.dtype, options.shard_bytes)


def _from_trainer(ckpt, options: ConvertOptions):
    """A trainer checkpoint: full weights -> hf (default) or torch_dist; a LoRA adapter -> peft."""
    from rlx.convert.peft_export import PeftJob, holds_adapter

    megatron = ckpt.path / "megatron"
    if is_torch_dist(megatron):  # trainer.backend=megatron: the weights are a torch_dist checkpoint, hf/ beside it
        to = options.to or "hf"
        _check_target(to)
        if to != "hf":
            raise ConvertError(
                f"{ckpt.path} is a checkpoint of trainer.backend=megatron: its weights are already torch_dist "
                f"({megatron}); convert it with --to hf"
            )
        require_megatron(f"converting {megatron} from torch_dist")
        return _from_torch_dist(megatron, "hf", parse_dtype(options.dtype), options)
    adapter = holds_adapter(ckpt)
    to = options.to or ("peft" if adapter else "hf")
    _check_target(to)
    dtype = parse_dtype(options.dtype)
    if adapter and to != "peft":
        raise ConvertError(
            f"{ckpt.path} holds a LoRA adapter (model.lora.rank > 0), not full weights; export "
            "it with --to peft (the default for it), then load it onto the base model with peft"
        )
    if to == "peft":
        return PeftJob(ckpt, dtype)
    if to == "hf":
        return trainer_to_hf_job(ckpt, dtype, options.shard_bytes, options.workers)
    source = SafetensorsDir(ckpt.path, files=ckpt.model_files)
    return _to_torch_dist(source, ckpt.hf_dir, dtype, options, ckpt.skipped)


def _to_torch_dist(source: SafetensorsDir, template: Path, dtype, options: ConvertOptions, skipped: list[str]):
    from rlx.convert.megatron.to_torch_dist import hf_to_torch_dist_job

    job = hf_to_torch_dist_job(source, template, dtype, options.vocab_multiple, options.iteration or 0)
    job.notes += [f"skipped: {reason}" for reason in skipped]
    return job


def _from_torch_dist(src: Path, to: str, dtype, options: ConvertOptions):
    if to != "hf":
        raise ConvertError(f"{src} is already a torch_dist checkpoint; convert it with --to hf")
    from rlx.convert.megatron.from_torch_dist import torch_dist_to_hf_job

    hf_config = Path(options.hf_config) if options.hf_config else None
    return torch_dist_to_hf_job(src, hf_config, options.iteration, dtype, options.shard_bytes, 1)
