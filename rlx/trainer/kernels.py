"""Fused Triton kernels for the trainer's model on CUDA, from liger-kernel (``trainer.fused_kernels``).

Liger's RMSNorm and SwiGLU kernels replace the ``forward`` of the model's RMSNorm and gated-MLP
modules, on this model instance only (other models in the process, such as a plain reference loop,
keep theirs). On an H100 (torch 2.11, Qwen3-0.6B shape, bf16) they took the trainer's update from
0.97-0.99x a plain transformers loop's tokens/s at 16k tokens to 1.09-1.24x, and lowered its peak
memory: the norm and the gate keep fewer activations for the backward (``benchmarks/bench_trainer.py``). Rotary
embeddings, attention and the LM head stay as they are (the logprob path has its own chunked head,
``rlx.trainer.logprobs``).

``auto`` uses them on CUDA where liger-kernel is installed (the ``gpu`` extra) and the architecture
is one whose norms and MLP they reproduce exactly (RMSNorm without offset, SiLU-gated MLP); ``on``
makes each of those conditions an error; ``off`` never uses them. Nothing changes on a CPU.
"""

from __future__ import annotations

import torch

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
"""model_type values whose RMSNorm (weight * x / rms, no offset) and gate/up/down SiLU MLP Liger's kernels
compute exactly as transformers does."""


def apply_fused_kernels(model, mode: str, device: torch.device) -> bool:
    """Patch ``model``'s RMSNorm and MLP modules with Liger's kernels when ``mode`` allows; whether it did."""
    if mode == "off":
        return False
    why_not = _why_not(model, device)
    if why_not:
        if mode == "on":
            raise ValueError(f"trainer.fused_kernels=on: {why_not}; set trainer.fused_kernels=auto or off")
        return False
    from liger_kernel.transformers.monkey_patch import _patch_rms_norm_module, _patch_swiglu_module
    from liger_kernel.transformers.swiglu import LigerSwiGLUMLP

    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            _patch_rms_norm_module(module)
        elif all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj")):
            _patch_swiglu_module(module, LigerSwiGLUMLP)
    return True


def _why_not(model, device: torch.device) -> str:
    if device.type != "cuda":
        return f"the trainer runs on {device.type}, and the kernels are CUDA (Triton) only"
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        return "liger-kernel is not installed (pip install 'rlx[gpu]', or pip install liger-kernel)"
    config = model.config
    if config.model_type not in ARCHITECTURES:
        return f"model_type {config.model_type!r} is not one of {', '.join(ARCHITECTURES)}"
    if getattr(config, "hidden_act", "silu") not in ("silu", "swish"):
        return f"the MLP's activation is {config.hidden_act!r}; the fused kernel computes SiLU"
    return ""
