"""Load the policy (and reference) model and tokenizer from a local path; shard with FSDP2.

One rank trains the plain module (no wrapping overhead); several ranks shard every decoder
layer and then the root with ``fully_shard`` over a 1-D device mesh (gloo on CPU, NCCL on
GPU). LoRA adapters are injected before sharding, so their factors are sharded with their
layer. With packed micro-batches the model runs ``rlx.trainer.attention``'s packed-sequence
attention instead of ``model.attn_implementation``. Nothing is downloaded here: `rlx train` resolves
a Hub id to a snapshot directory of huggingface_hub's cache before any process starts
(``rlx.launch.hub_models``), and a path that is not a local directory is an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from rlx.formats.hf_dir import TOKENIZER_MARKERS, has_tokenizer, read_json_object
from rlx.placement import device_type

if TYPE_CHECKING:
    from rlx.config.model import ModelConfig


def resolve_device(want: str) -> torch.device:
    """This rank's device: its GPU (rank modulo the visible GPUs) by the device rule, else the CPU."""
    if device_type(want) == "cuda":
        index = dist.get_rank() % torch.cuda.device_count() if dist.is_initialized() else 0
        return torch.device("cuda", index)
    return torch.device("cpu")


def check_model_dir(path: str, key: str = "model.path") -> Path:
    """``path`` as a Path if it holds what training and the rollout engines load: a config.json that
    parses, weights (safetensors whose headers check out, or ``.bin``) and a tokenizer; else one error
    naming what is missing (``key``: the config key that names the directory)."""

    from rlx.config.errors import ConfigError
    from rlx.formats.hub import snapshot_of

    model_dir = Path(path)
    snap = snapshot_of(path)
    if snap is not None and not model_dir.is_dir():  # resolved by the launcher on another node, or since deleted
        raise FileNotFoundError(
            f"{key}={path!r}: the snapshot of {snap.repo_id} at commit {snap.commit} that `rlx train` resolved is "
            f"not on this machine; give every node the same HF_HOME (shared storage), or fetch it here: "
            f"hf download {snap.repo_id} --revision {snap.commit}"
        )
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"{key}={path!r} is not a Hugging Face model directory (no config.json); "
            f"set {key} to a local directory with config.json, tokenizer and safetensors"
        )
    config = read_json_object(model_dir / "config.json", "a model config", "re-copy the model", error=ConfigError)
    if "model_type" not in config:
        raise ConfigError(f"{model_dir / 'config.json'} has no model_type; it is not a transformers model config")
    _check_weights(model_dir, path, key)
    if not has_tokenizer(model_dir):
        raise ConfigError(
            f"{key}={path!r} has no tokenizer (none of {', '.join(TOKENIZER_MARKERS)}); "
            "copy the model's tokenizer files into it"
        )
    return model_dir


def _check_weights(model_dir: Path, path: str, key: str) -> None:
    from rlx.config.errors import ConfigError
    from rlx.convert.errors import ConvertError
    from rlx.convert.safetensors_io import SafetensorsDir

    if any(model_dir.glob("*.safetensors")):
        try:
            SafetensorsDir(model_dir)  # headers, index and sizes: a truncated copy fails here, not in a child
        except ConvertError as exc:
            raise ConfigError(f"{key}={path!r}: {exc}") from None
    elif not any(model_dir.glob("*.bin")):
        raise ConfigError(
            f"{key}={path!r} has config.json but no weights (*.safetensors or *.bin); copy the "
            f"model's weight files into it, or set {key} to the complete model directory"
        )


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    m: ModelConfig,
    device: torch.device,
    trainable: bool = True,
    packed_attention: bool = False,
    fused_kernels: str = "off",
):
    """The model on ``device``; ``packed_attention`` switches it to packed-sequence attention. A trainable
    model gets LoRA adapters when ``model.lora.rank > 0`` (``rlx.trainer.lora``) and the ``fused_kernels``
    (``trainer.fused_kernels``) that apply; a frozen one stays plain."""
    from transformers import AutoModelForCausalLM

    check_model_dir(m.path)
    model = AutoModelForCausalLM.from_pretrained(
        m.path, dtype=getattr(torch, m.dtype), attn_implementation=m.attn_implementation
    )
    model.config.use_cache = False
    compute = m.compute_dtype
    model.rlx_compute_dtype = None if compute in ("auto", m.dtype) else getattr(torch, compute)
    if packed_attention:
        from rlx.trainer.attention import use_packed_attention

        use_packed_attention(model)
    if trainable:
        from rlx.trainer.kernels import apply_fused_kernels

        apply_fused_kernels(model, fused_kernels, device)
    if trainable and m.lora.rank:
        from rlx.trainer.lora import apply_lora

        model = apply_lora(model, m.lora, m.path)
    if trainable and m.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device)
    if not trainable:
        model.eval().requires_grad_(False)
    if dist.is_initialized() and dist.get_world_size() > 1:
        shard(model, device)
    return model


def has_dropout(model) -> bool:
    """Whether the model drops anything in train mode (a dropout module or a ``*dropout`` config value > 0)."""
    in_config = any(
        "dropout" in key and isinstance(value, float) and value > 0 for key, value in model.config.to_dict().items()
    )
    return in_config or any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def shard(model, device: torch.device) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def full_named_parameters(model):
    """(name, full tensor) per parameter in a fixed order; a collective when sharded (all ranks call it)."""
    for name, param in model.named_parameters():
        tensor = param.full_tensor() if hasattr(param, "full_tensor") else param
        yield name, tensor.detach()
