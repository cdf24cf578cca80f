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

Several trainer ranks: the adapters are injected before ``fully_shard`` (``rlx.trainer.model``), so the
factors are sharded DTensors like every other weight. The functions above then gather each tensor with
``full_tensor()`` (a collective: every rank iterates them, in the same order, as for a full model's sync
and checkpoint; rank 0 alone sends or writes), and ``load_adapter_state`` scatters a full adapter into the
shards with torch's distributed state-dict API.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlx.formats.peft import PEFT_PREFIX, peft_lora_config

ADAPTER = "default"


def apply_lora(model, lora, base_model_path: str = ""):
    """Inject LoRA adapters into ``model`` (in place); every other weight is frozen."""
    from peft import inject_adapter_in_model

    linear = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    if not set(lora.target_modules) & set(linear):
        raise ValueError(
            f"model.lora.target_modules={list(lora.target_modules)} matches no layer of the model; "
            f"set it to some of its linear layers: {', '.join(linear)}"
        )
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


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor shard gathered from every rank (a collective), a plain tensor as it is."""
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach()


@torch.no_grad()
def _delta_weight(layer, adapter: str) -> torch.Tensor:
    """``(alpha / r) * B @ A`` of ``layer``, computed as peft's ``get_delta_weight`` does (float32 on CPU for
    16-bit factors), from the gathered factors."""
    from peft.utils.other import transpose

    a, b = _full(layer.lora_A[adapter].weight), _full(layer.lora_B[adapter].weight)
    upcast = b.device.type == "cpu" and b.dtype in (torch.float16, torch.bfloat16)
    delta = transpose((b.float() @ a.float()) if upcast else b @ a, layer.fan_in_fan_out) * layer.scaling[adapter]
    return delta.to(b.dtype)


@torch.no_grad()
def merged_named_tensors(model):
    """(base name, tensor) of a plain model: adapted weights merged out of place, the rest as they are."""
    adapted = {name: m for name, m in model.named_modules() if _is_lora_layer(m)}
    for name, param in model.named_parameters():
        if any(part.startswith("lora_") for part in name.split(".")):
            continue
        module_name, marker, leaf = name.rpartition(".base_layer.")
        if not marker:
            yield name, _full(param)
            continue
        tensor = _full(param)
        layer = adapted[module_name]
        if leaf == "weight" and not layer.merged:
            for adapter in layer.active_adapters:
                tensor = tensor + _delta_weight(layer, adapter)
        yield f"{module_name}.{leaf}", tensor


def _adapter_names(model) -> dict[str, str]:
    """PEFT's name without the prefix (``<module>.lora_A.weight``: the adapter's name taken out, as
    ``peft.get_peft_model_state_dict`` saves it) -> the model's own name, per adapter parameter."""
    tag = f".{ADAPTER}."
    return {
        name.replace(tag, "."): name
        for name, _ in model.named_parameters()
        if tag in name and (".lora_A." in name or ".lora_B." in name)
    }


def adapter_named_tensors(model):
    """(name, tensor) of the adapter alone, for ``model.lora.sync=adapter``: ``<module>.lora_A.weight`` [r, in]
    and ``<module>.lora_B.weight`` [out, r] under the base model's module names, in the trainer's dtype (the
    receiver merges in float32, as ``merged_named_tensors`` does). Gathered when sharded: every rank iterates."""
    params = dict(model.named_parameters())
    for key, name in _adapter_names(model).items():
        yield key, _full(params[name])


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapter weights under PEFT's saved names (what ``adapter_model.safetensors`` holds); gathered when
    sharded, so every rank calls it."""
    return {PEFT_PREFIX + key: tensor.cpu().contiguous() for key, tensor in adapter_named_tensors(model)}


def load_adapter_state(model, state: dict[str, torch.Tensor]) -> None:
    """Set the adapter weights from ``adapter_state``'s names (on every rank, each holding the full state;
    sharded parameters take their shard); a missing or unexpected key is an error."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    names = _adapter_names(model)
    expected = {PEFT_PREFIX + key for key in names}
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(
            f"the adapter in the checkpoint does not fit model.lora (missing: {missing[:3]}, "
            f"unexpected: {extra[:3]}); resume with that run's model.lora settings"
        )
    full = {names[key.removeprefix(PEFT_PREFIX)]: value for key, value in sorted(state.items())}
    result = set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, strict=False))
    assert not result.unexpected_keys, result.unexpected_keys


def absolute_model_path(path: str) -> str:
    """A local model directory as an absolute path (``model.path`` is relative to where `rlx train` ran, and an
    adapter is loaded from anywhere, e.g. by ``AutoPeftModelForCausalLM``); anything else unchanged."""
    return str(Path(path).resolve()) if path and Path(path).is_dir() else str(path)


def adapter_config(model, base_model_path: str) -> dict:
    """``adapter_config.json`` of the injected adapter, as PEFT writes it (JSON types only)."""
    config = model.peft_config[ADAPTER].to_dict()
    config["base_model_name_or_path"] = absolute_model_path(base_model_path)
    config["inference_mode"] = True
    return {
        k: sorted(v) if isinstance(v, set) else (str(v.value) if hasattr(v, "value") else v) for k, v in config.items()
    }
