"""PEFT's LoRA adapter format, as the trainer saves it and vLLM loads it: the key prefix of an adapter's
tensors and the ``LoraConfig`` of a ``model.lora`` section (written out as ``adapter_config.json``).

Used by the trainer (``rlx.trainer.lora``) and the rollout server's adapter loader
(``rlx.rollout.backends.lora``). Left out: injecting or merging adapters (the trainer's job). peft is
imported only when a config is made.
"""

from __future__ import annotations

PEFT_PREFIX = "base_model.model."
"""Key prefix of PEFT's saved adapters (a PeftModel's path to the wrapped transformers model)."""


def peft_lora_config(lora, base_model_path: str = ""):
    """A ``peft.LoraConfig`` for the ``model.lora`` section."""
    try:
        from peft import LoraConfig
    except ImportError:
        raise ImportError("model.lora.rank > 0 needs peft; install it with pip install -e '.[lora]'") from None
    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model_path or None,
    )
