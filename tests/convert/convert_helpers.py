"""Helpers for the conversion tests: tiny Llama / Qwen3 models in the kit's style (the kit builds
Qwen2), trainer checkpoints in the rlx format, and reading a whole HF directory back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from rlx.formats.checkpoint import step_dir_name, write_manifest
from rlx.trainer.tiny import build_tiny_model, build_tokenizer

_CLASSES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def build_family_model(
    out_dir: Path,
    family: str,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int | None = None,
    tie_word_embeddings: bool = False,
    dtype: str = "float32",
    seed: int = 0,
    lm_head_scale: float = 1.0,
) -> Path:
    """``lm_head_scale`` > 1 makes the next-token distributions peaked (random models are near uniform)."""
    if family == "qwen2":
        return build_tiny_model(
            out_dir,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            tie_word_embeddings=tie_word_embeddings,
            dtype=dtype,
            seed=seed,
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    config_cls, model_cls = _CLASSES[family]
    config = config_cls(
        vocab_size=(len(tokenizer) + 63) // 64 * 64,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim or hidden_size // num_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=tie_word_embeddings,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = model_cls(config).to(getattr(torch, dtype))
    _randomize_norms(model)
    with torch.no_grad():
        model.lm_head.weight.mul_(lm_head_scale)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    config_path = out_dir / "config.json"
    saved = json.loads(config_path.read_text())
    saved["torch_dtype"] = saved["dtype"] = dtype
    config_path.write_text(json.dumps(saved, indent=2) + "\n")
    return out_dir


def _randomize_norms(model) -> None:
    # Norm weights start at 1.0 everywhere; random ones make a mix-up between norms visible.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)


def write_trainer_checkpoint(run_dir: Path, model, hf_dir: Path, step: int, num_model_files: int = 2) -> Path:
    """Write ``model`` as an rlx trainer checkpoint (the format of rlx.formats.checkpoint)."""
    ckpt = Path(run_dir) / "checkpoints" / step_dir_name(step)
    (ckpt / "hf").mkdir(parents=True)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    names = sorted(state)
    files = []
    for i in range(num_model_files):
        part = {k: state[k] for k in names[i::num_model_files]}
        files.append(f"model-{i:05d}.safetensors")
        save_file(part, ckpt / files[-1])
    save_file({f"{k}.exp_avg": torch.zeros(1) for k in names[:2]}, ckpt / "optimizer.safetensors")
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": step}))
    for path in Path(hf_dir).iterdir():
        if path.is_file() and not path.name.endswith(".safetensors"):
            shutil.copy2(path, ckpt / "hf" / path.name)
    write_manifest(ckpt, step, files, {})
    return ckpt


def read_hf_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF directory, checking that the index (if any) lists exactly them."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    files = sorted(json.loads(index.read_text())["weight_map"].values()) if index.is_file() else ["model.safetensors"]
    tensors = {}
    for name in sorted(set(files)):
        tensors.update(load_file(model_dir / name))
    if index.is_file():
        assert set(json.loads(index.read_text())["weight_map"]) == set(tensors)
    return tensors


def tree_digest(path: Path) -> dict[str, tuple[int, int, bytes]]:
    """(size, mtime_ns, content) of every file under ``path``: proves a source was not modified."""
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(Path(path).rglob("*"))
        if p.is_file()
    }
