"""LoRA training through peft: adapters injected into the transformers model, merged views for sync.

``apply_lora`` injects peft LoRA layers into the plain transformers model (``inject_adapter_in_model``,
so the module keeps its class, ``model.model`` and ``lm_head`` and the logprob code needs no
change); only the adapter weights require grad, so only they reach the optimizer and the checkpoint.
``merged_named_tensors`` yields the weights a plain model of the base architecture would hold:
``W + (alpha / r) * B @ A`` (peft's own ``get_delta_weight``) for adapted layers and the base
tensor otherwise, under the base model's names, computed out of place: the trainer's weights are
never merged (``model.lora.sync=merged``: the engines load a plain model and the sync carries the
full model's bytes). ``adapter_state`` / ``load_adapter_state`` move the adapter in PEFT's file format
(keys ``base_model.model.<module>.lora_A.weight``), which ``rlx convert-ckpt --to peft`` copies out.

``adapter_named_tensors`` is the adapter-only sync (``model.lora.sync=adapter``): only the factors move,
and the rollout server merges them (``rlx.rollout.backends.lora``).

Left out: sharding (LoRA trains on one rank).
"""

from __future__ import annotations

import torch

ADAPTER = "default"
PEFT_PREFIX = "base_model.model."
"""Key prefix of PEFT's saved adapters (a PeftModel's path to the wrapped transformers model)."""


def peft_lora_config(lora, base_model_path: str = ""):
    """A ``peft.LoraConfig`` for the ``model.lora`` section."""
    try:
        from peft import LoraConfig
    except ImportError:
        raise ImportError("model.lora.rank > 0 needs peft; install it with pip install -e '.[lora]'") from None
    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM",
                      base_model_name_or_path=base_model_path or None)


def apply_lora(model, lora, base_model_path: str = ""):
    """Inject LoRA adapters into ``model`` (in place); every other weight is frozen."""
    from peft import inject_adapter_in_model

    linear = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    if not set(lora.target_modules) & set(linear):
        raise ValueError(f"model.lora.target_modules={list(lora.target_modules)} matches no layer of the model; "
                         f"set it to some of its linear layers: {', '.join(linear)}")
    model = inject_adapter_in_model(peft_lora_config(lora, base_model_path), model, adapter_name=ADAPTER)
    return model


def is_lora(model) -> bool:
    return any(_is_lora_layer(m) for m in model.modules())


def _is_lora_layer(module) -> bool:
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return False
    return isinstance(module, LoraLayer)


@torch.no_grad()
def merged_named_tensors(model):
    """(base name, tensor) of a plain model: adapted weights merged out of place, the rest as they are."""
    adapted = {name: m for name, m in model.named_modules() if _is_lora_layer(m)}
    for name, param in model.named_parameters():
        if any(part.startswith("lora_") for part in name.split(".")):
            continue
        module_name, marker, leaf = name.rpartition(".base_layer.")
        if not marker:
            yield name, param.detach()
            continue
        tensor = param.detach()
        layer = adapted[module_name]
        if leaf == "weight" and not layer.merged:
            for adapter in layer.active_adapters:
                tensor = tensor + layer.get_delta_weight(adapter)
        yield f"{module_name}.{leaf}", tensor


def adapter_named_tensors(model):
    """(name, tensor) of the adapter alone, for ``model.lora.sync=adapter``: ``<module>.lora_A.weight`` [r, in]
    and ``<module>.lora_B.weight`` [out, r] under the base model's module names, in the trainer's dtype (the
    receiver merges in float32, as ``merged_named_tensors`` does)."""
    from peft import get_peft_model_state_dict

    for key, value in get_peft_model_state_dict(model, adapter_name=ADAPTER).items():
        yield key, value.detach()


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapter weights under PEFT's saved names (what ``adapter_model.safetensors`` holds)."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    return {PEFT_PREFIX + key: value.detach().cpu().contiguous() for key, value in state.items()}


def load_adapter_state(model, state: dict[str, torch.Tensor]) -> None:
    """Set the adapter weights from ``adapter_state``'s names; a missing or unexpected key is an error."""
    from peft import set_peft_model_state_dict

    expected = set(adapter_state(model))
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(f"the adapter in the checkpoint does not fit model.lora (missing: {missing[:3]}, "
                         f"unexpected: {extra[:3]}); resume with that run's model.lora settings")
    stripped = {key.removeprefix(PEFT_PREFIX): value for key, value in state.items()}
    result = set_peft_model_state_dict(model, stripped, adapter_name=ADAPTER)
    assert not getattr(result, "unexpected_keys", None), result.unexpected_keys


def adapter_config(model, base_model_path: str) -> dict:
    """``adapter_config.json`` of the injected adapter, as PEFT writes it (JSON types only)."""
    config = model.peft_config[ADAPTER].to_dict()
    config["base_model_name_or_path"] = str(base_model_path)
    config["inference_mode"] = True
    return {k: sorted(v) if isinstance(v, set) else (str(v.value) if hasattr(v, "value") else v)
            for k, v in config.items()}
