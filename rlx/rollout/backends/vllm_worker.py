"""Worker extension that vLLM mixes into each engine worker to receive weights from rlx.

One call, ``rlx_update_weights(payload) -> ack``: the bytes of one sync request, exactly as the
trainer's sender encoded them, go to an ``rlx.sync.receiver.SyncHandler`` that dispatches them,
with ``_VllmLoader`` as its consumer: a begin starts vLLM's layerwise reload (which restores the
checkpoint-format parameters that post-processing replaced, e.g. the CPU backend's packed GEMM
weights), a bucket goes to ``model.load_weights`` and is acknowledged only after that returns, the
end runs post-processing once and releases every mapping. Any failure aborts the sync -- the reload
is finalized (layers that got no tensor keep their old weights) and the receiver's state and
mappings dropped -- and comes back as a failed ack, so the engine generates again and takes the
next sync.

vLLM's reload warns "Failed to load weights" for every layer that received no tensor. Two of
those are expected at every sync and are not logged: rotary embeddings (their buffers are computed,
never in a checkpoint) and, with tied embeddings, the LM head (re-tied after the sync). Any other
layer that misses its weights is still reported.
"""

from __future__ import annotations

import logging

from rlx.sync.receiver import Consumer, SyncHandler, WeightReceiver


class _ExpectedReloadWarnings(logging.Filter):
    def __init__(self, tied_head: bool) -> None:
        super().__init__()
        self.tied_head = tied_head

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "%s: Failed to load weights" or not record.args:
            return True
        layer = str(record.args[0])
        return not (layer.endswith("RotaryEmbedding") or (self.tied_head and layer == "ParallelLMHead"))


class WeightSyncExtension:
    def rlx_memory_gb(self) -> tuple[float, float]:
        """GiB this worker's torch allocator holds now, and its peak since the previous call (0 on a CPU)."""
        import torch

        if not torch.cuda.is_available():
            return 0.0, 0.0
        now, peak = torch.cuda.memory_reserved() / 2**30, torch.cuda.max_memory_reserved() / 2**30
        torch.cuda.reset_peak_memory_stats()
        return now, peak

    def rlx_update_weights(self, payload: bytes) -> bytes:
        handler = getattr(self, "_rlx_handler", None)
        if handler is None:
            name = f"vLLM worker {getattr(self, 'rank', 0)}"
            consumer = getattr(self, "_rlx_adapter_loader", None) or _VllmLoader(self)
            handler = self._rlx_handler = SyncHandler(WeightReceiver(name), consumer)
        return handler.handle_bytes(payload)

    def rlx_serve_adapter(self, directory: str, adapter_config: str) -> None:
        """``model.lora.sync=adapter``: syncs carry LoRA factors, loaded as the engine's LoRA
        (``rlx.rollout.backends.lora.VllmAdapterLoader``) instead of into the weights."""
        from rlx.rollout.backends.lora import VllmAdapterLoader

        self._rlx_adapter_loader = VllmAdapterLoader(self, directory, adapter_config)


class _VllmLoader(Consumer):
    """The handler's consumer inside a vLLM worker: a layerwise reload around ``load_weights``."""

    def __init__(self, worker) -> None:
        self.worker = worker
        self.reloading = False
        self.quieted = False

    def model(self):
        return self.worker.model_runner.get_model()

    def begin(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        if not self.quieted:
            tied = bool(getattr(getattr(self.model(), "config", None), "tie_word_embeddings", False))
            logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
                _ExpectedReloadWarnings(tied))
            self.quieted = True
        with set_current_vllm_config(self.worker.vllm_config):
            self.reloading = True
            initialize_layerwise_reload(self.model())

    def load(self, tensors, verify: bool) -> None:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.worker.vllm_config):
            self.model().load_weights(weights=tensors)  # the receiver checksums the bytes it handed out

    def end(self) -> None:
        self.abort()

    def abort(self) -> None:
        """Run the reload's post-processing if a reload is in progress (never twice)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        if not self.reloading:
            return
        self.reloading = False
        with set_current_vllm_config(self.worker.vllm_config):
            finalize_layerwise_reload(self.model(), self.worker.model_config)
            _retie_lm_head(self.model())


def _retie_lm_head(model) -> None:
    """With tied embeddings the checkpoint has no lm_head.weight, so layerwise reload puts the
    old head back; point it at the new embedding again and redo its post-processing (on CPU
    that re-packs the GEMM weights the sampler uses)."""
    config = getattr(model, "config", None)
    lm_head = getattr(model, "lm_head", None)
    if not getattr(config, "tie_word_embeddings", False) or lm_head is None:
        return
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else model.model.embed_tokens
    lm_head.tie_weights(embed)
    quant_method = getattr(lm_head, "quant_method", None)
    if quant_method is not None:
        quant_method.process_weights_after_loading(lm_head)
