"""Adapter-only weight sync (``model.lora.sync=adapter``) on the rollout side: the hf merge and vLLM's LoRA.

The trainer sends only the LoRA factors, ``<module>.lora_A.weight`` [r, in] and ``<module>.lora_B.weight``
[out, r] under the base model's module names, in the trainer's dtype (``rlx.trainer.lora.adapter_named_tensors``).

``hf`` backend -- ``AdapterMerger`` keeps, for each adapted module, the base weight as it was before any adapter
touched it (copied, in float32, the first time that module's factors arrive), collects a sync's factors, and at
its end writes ``W = W_base + (alpha / r) * B @ A`` into the module's weight in place, computed in float32 and cast
to the engine's dtype -- the same sum, in the same precision, that the trainer's merged sync sends. Merging
instead of injecting peft's LoRA layers into the server's model: a merged weight is a plain ``nn.Linear``, so
generation runs at the base model's speed (no two extra matmuls and no peft forward per adapted layer and
token), the logprob code stays the model's own, and the extra memory is one float32 copy of the adapted weights.
Tensors under any other name are copied into the parameter of that name, except an adapted module's own weight:
that one is the merge's output, and overwriting it would leave the kept base stale, so it is refused with the fix.

vLLM backend -- ``VllmAdapterLoader`` runs in each engine worker: a sync's factors become a PEFT directory that the
worker loads in place as the engine's one LoRA; the backend then sends every request with that ``LoRARequest``.
vLLM applies the adapter at every forward (its punica kernels), so generation pays for it; it keeps the base
weights untouched and needs no layerwise reload.

Left out: DoRA, rsLoRA and ``fan_in_fan_out`` layers (rlx's trainer configures none of them).
"""

from __future__ import annotations

import torch

from rlx.sync.receiver import Consumer

FACTORS = (".lora_A.weight", ".lora_B.weight")


def split_factor_name(name: str) -> tuple[str, str] | None:
    """``("model.layers.0.self_attn.q_proj", "lora_A")`` for a factor's name, ``None`` for any other."""
    for suffix in FACTORS:
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix[1:7]
    return None


class AdapterMerger(Consumer):
    """The hf backend's sync consumer when factors may arrive: merges them into the adapted weights."""

    def __init__(self, model, scaling: float | None) -> None:
        self.model = model
        self.scaling = scaling  # alpha / r of the run's model.lora; None: this server has no LoRA config
        self.targets = {**dict(model.named_buffers()), **dict(model.named_parameters())}
        self.base: dict[str, torch.Tensor] = {}  # module name -> its weight before any adapter, float32
        self.pending: dict[str, dict[str, torch.Tensor]] = {}  # this sync's factors, by module

    def destination(self, name: str, dtype, shape: list[int], device):
        """A plain parameter the sender's bytes fit as they are (see ``_ModelLoader.destination``)."""
        tensor = self.targets.get(name)
        if (
            tensor is None
            or tensor.dtype != dtype
            or list(tensor.shape) != shape
            or tensor.device != device
            or not tensor.is_contiguous()
            or name.removesuffix(".weight") in self.base
        ):
            return None
        return tensor.detach()

    def begin(self) -> None:
        self.pending = {}

    @torch.no_grad()
    def load(self, tensors, verify: bool) -> None:
        for name, tensor in tensors:
            factor = split_factor_name(name)
            if factor is not None:
                self._keep_factor(name, *factor, tensor)
                continue
            if name not in self.targets:
                raise KeyError(f"the model has no parameter {name!r}")
            if name.removesuffix(".weight") in self.base:
                raise ValueError(
                    f"{name!r} arrived as a whole weight, but this server merges adapters into it "
                    "(model.lora.sync=adapter); run the trainer and the server with the same "
                    "model.lora.sync"
                )
            target = self.targets[name]
            if tensor.data_ptr() != target.data_ptr() or tensor.numel() == 0:
                target.copy_(tensor.view(target.shape))

    def _keep_factor(self, name: str, module: str, which: str, tensor: torch.Tensor) -> None:
        if self.scaling is None:
            raise ValueError(
                f"{name!r} is a LoRA factor, but this server runs without model.lora; start it "
                "with the trainer's model.lora settings"
            )
        weight = self.targets.get(f"{module}.weight")
        if weight is None or weight.dim() != 2:
            raise KeyError(f"{name!r}: the model has no linear layer {module!r} to adapt")
        self.pending.setdefault(module, {})[which] = tensor.to(torch.float32, copy=True)

    @torch.no_grad()
    def end(self) -> None:
        incomplete = sorted(m for m, f in self.pending.items() if len(f) != 2)
        if incomplete:
            raise ValueError(
                f"the sync sent only one of lora_A / lora_B for {incomplete[:3]}; "
                "an adapter sync must carry both factors of every adapted layer"
            )
        for module, factors in self.pending.items():
            weight = self.targets[f"{module}.weight"]
            a, b = factors["lora_A"], factors["lora_B"]
            if a.shape[1] != weight.shape[1] or b.shape[0] != weight.shape[0] or a.shape[0] != b.shape[1]:
                raise ValueError(
                    f"{module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit its "
                    f"weight {list(weight.shape)}; the trainer's model.lora and model.path must match "
                    "the server's"
                )
            base = self.base.get(module)
            if base is None:  # first adapter for this module: the weight is still the checkpoint's
                base = self.base[module] = weight.detach().to(torch.float32, copy=True)
            weight.copy_((base + (b.to(base.device) @ a.to(base.device)) * self.scaling).to(weight.dtype))
        self.pending = {}

    def abort(self) -> None:
        self.pending = {}  # the weights are only written at the end: an aborted sync changed none


VLLM_ADAPTER = "rlx-adapter"
VLLM_ADAPTER_ID = 1
"""The one LoRA the vLLM engine serves: every sync reloads it in place under this name and id."""
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts (``vllm.config.lora.MaxLoRARanks``)."""


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds adapters of rank ``rank``."""
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(
            f"model.lora.rank={rank} is above vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}; "
            "lower model.lora.rank or set model.lora.sync=merged"
        )
    return fitting[0]


def peft_adapter_config(lora, base_model_path: str) -> str:
    """``adapter_config.json`` of the run's ``model.lora``, as PEFT writes it (what vLLM reads)."""
    import json

    from rlx.formats.peft import peft_lora_config

    config = peft_lora_config(lora, base_model_path).to_dict()
    config["inference_mode"] = True
    return json.dumps(
        {
            k: sorted(v) if isinstance(v, set) else (str(v.value) if hasattr(v, "value") else v)
            for k, v in config.items()
        }
    )


class VllmAdapterLoader(Consumer):
    """Inside a vLLM worker (``model.lora.sync=adapter``): each sync's factors become a PEFT directory
    (``adapter_model.safetensors`` under PEFT's names + ``adapter_config.json``) that the worker loads in
    place as the engine's one LoRA (``VLLM_ADAPTER``, ``load_inplace``), so requests in flight across the
    update go on with the new adapter, as they go on with new weights in a merged sync.

    vLLM 0.x loads a LoRA only from a directory (no in-memory variant); the directory is the worker's own
    under the server's private one (``/dev/shm`` where there is one), rewritten at every sync."""

    def __init__(self, worker, directory: str, adapter_config: str) -> None:
        from pathlib import Path

        self.worker = worker
        self.path = Path(directory) / f"rank{getattr(worker, 'rank', 0)}"
        self.adapter_config = adapter_config
        self.pending: dict[str, torch.Tensor] = {}

    def begin(self) -> None:
        self.pending = {}

    def load(self, tensors, verify: bool) -> None:
        from rlx.formats.peft import PEFT_PREFIX

        for name, tensor in tensors:
            if split_factor_name(name) is None:
                raise ValueError(
                    f"{name!r} arrived as a whole weight, but this vLLM server serves the adapter "
                    "as a LoRA (model.lora.sync=adapter); run the trainer and the server with the "
                    "same model.lora.sync"
                )
            self.pending[PEFT_PREFIX + name] = tensor.to("cpu", copy=True).contiguous()

    def end(self) -> None:
        import shutil

        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        staged = self.path.with_name(self.path.name + ".staged")
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        save_file(self.pending, str(staged / "adapter_model.safetensors"), metadata={"format": "pt"})
        (staged / "adapter_config.json").write_text(self.adapter_config)
        shutil.rmtree(self.path, ignore_errors=True)
        staged.rename(self.path)
        self.pending = {}
        self.worker.add_lora(LoRARequest(VLLM_ADAPTER, VLLM_ADAPTER_ID, str(self.path), load_inplace=True))

    def abort(self) -> None:
        self.pending = {}  # the adapter is only replaced at the end: an aborted sync changed nothing
