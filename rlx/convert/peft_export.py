"""LoRA trainer checkpoint -> Hugging Face PEFT adapter directory.

A LoRA run's checkpoint (``rlx.trainer.lora``) already holds the adapter in PEFT's format:
``adapter_model.safetensors`` (keys ``base_model.model.<module>.lora_A.weight``) and
``adapter_config.json`` (``base_model_name_or_path`` = the run's ``model.path``). The export
copies both, verified, casting floating tensors with ``--dtype``, plus the tokenizer files, into
a directory that ``peft.PeftModel.from_pretrained(base, dir)`` and vLLM's LoRA loading read.

Left out: merging the adapter into the base weights (load the adapter with peft and call
``merge_and_unload()``), and adapters made by other tools.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console

from rlx.convert.destination import staged_directory
from rlx.convert.errors import ConvertError
from rlx.convert.hf_job import RunSummary
from rlx.convert.hf_write import target_dtype
from rlx.convert.plan import Plan, PlanRow
from rlx.convert.safetensors_io import SafetensorsDir
from rlx.convert.trainer_ckpt import TrainerCheckpoint
from rlx.formats.checkpoint import ADAPTER_CONFIG, ADAPTER_FILE
from rlx.formats.hf_dir import TOKENIZER_FILES, copy_files, read_json_object


def holds_adapter(ckpt: TrainerCheckpoint) -> bool:
    return ADAPTER_FILE in ckpt.model_files


@dataclass
class PeftJob:
    ckpt: TrainerCheckpoint
    dtype: torch.dtype | None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not holds_adapter(self.ckpt):
            raise ConvertError(
                f"{self.ckpt.path} holds full model weights, not a LoRA adapter; export it with "
                "--to hf (a PEFT adapter comes from a run with model.lora.rank > 0)"
            )
        self.source = SafetensorsDir(self.ckpt.path, files=[ADAPTER_FILE])
        self.config = _read_adapter_config(self.ckpt.path / ADAPTER_CONFIG)
        base = self.config.get("base_model_name_or_path")
        self.notes = [f"skipped: {reason}" for reason in self.ckpt.skipped]
        if isinstance(base, str) and base and not Path(base).is_absolute():  # a checkpoint of an older rlx
            if Path(base).is_dir():
                base = self.config["base_model_name_or_path"] = str(Path(base).resolve())
            else:
                self.notes.append(
                    f"base model {base!r} is a relative path that does not exist from here; set "
                    "base_model_name_or_path in the adapter_config.json written to the base model's "
                    "directory"
                )
        self.notes.append(
            f"base model: {base} (adapter_config.json base_model_name_or_path; load the adapter onto that model)"
        )

    def plan(self, destination: Path) -> Plan:
        rows = []
        for name in sorted(self.source.tensors):
            info = self.source.tensors[name]
            dtype = target_dtype(info.torch_dtype, self.dtype)
            nbytes = info.nbytes // info.torch_dtype.itemsize * dtype.itemsize
            rows.append(PlanRow(name, (name,), info.shape, str(dtype).removeprefix("torch."), nbytes, ADAPTER_FILE))
        return Plan(
            f"LoRA trainer checkpoint (step {self.ckpt.step}) -> PEFT adapter",
            str(self.ckpt.path),
            str(destination),
            rows,
            self.source.total_bytes,
            2 * self.source.total_bytes,
            list(self.notes),
        )

    def run(self, destination: Path, console: Console | None = None, show_progress: bool = True) -> RunSummary:
        from safetensors.torch import save_file

        start = time.perf_counter()
        tensors = {name: self._read(name) for name in sorted(self.source.tensors)}
        with staged_directory(destination) as tmp:
            save_file(tensors, str(tmp / ADAPTER_FILE), metadata={"format": "pt"})
            (tmp / ADAPTER_CONFIG).write_text(json.dumps(self.config, indent=2) + "\n")
            copy_files(self.ckpt.hf_dir, tmp, TOKENIZER_FILES)
        files = sorted(p.name for p in destination.iterdir())
        bytes_out = (destination / ADAPTER_FILE).stat().st_size
        return RunSummary(
            destination, files, self.source.total_bytes, bytes_out, time.perf_counter() - start, list(self.notes)
        )

    def _read(self, name: str) -> torch.Tensor:
        tensor = self.source.read(name)
        return tensor.to(target_dtype(tensor.dtype, self.dtype)).contiguous()


def _read_adapter_config(path: Path) -> dict:
    try:
        config = read_json_object(path, "a LoRA adapter config", "the checkpoint is corrupt", error=ConvertError)
    except FileNotFoundError:
        raise ConvertError(
            f"{path.parent} has {ADAPTER_FILE} but no {ADAPTER_CONFIG}; the checkpoint is "
            "incomplete, pass an earlier step_* directory"
        ) from None
    if config.get("peft_type") != "LORA":
        raise ConvertError(
            f"{path} is not a LoRA adapter config (peft_type={config.get('peft_type')!r} "
            "expected 'LORA'); the checkpoint is corrupt"
        )
    return config
