"""Worker extension that vLLM mixes into each engine worker to receive weights from rlx.

Per sync: ``rlx_sync_begin`` maps the transport buffer and starts vLLM's layerwise reload
(which restores the checkpoint-format parameters that post-processing replaced, e.g. the CPU
backend's packed GEMM weights); ``rlx_sync_bucket`` hands the bucket's tensors to
``model.load_weights`` and acknowledges only after that returns (process-then-ack);
``rlx_sync_end`` runs post-processing once and releases every mapping. Errors come back as
a failed ack instead of an exception, so a bad bucket never takes the engine down.
``rlx_sync_abort`` ends a sync that will get no ``rlx_sync_end`` (its sender failed or vanished):
it finalizes a reload in progress (layers that got no tensor keep their old weights) and drops
the receiver's state and mappings, so the engine generates again and the next sync starts clean;
a ``rlx_sync_begin`` that fails does the same before it answers.

vLLM's reload warns "Failed to load weights" for every layer that received no tensor. Two of
those are expected at every sync and are not logged: rotary embeddings (their buffers are computed,
never in a checkpoint) and, with tied embeddings, the LM head (re-tied after the sync). Any other
layer that misses its weights is still reported.
"""

from __future__ import annotations

import logging

import msgspec

from rlx.sync.messages import BucketAck, SyncBegin, SyncBucket, SyncEnd


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
    def _rlx_receiver(self):
        if getattr(self, "_rlx_recv", None) is None:
            from rlx.sync.receiver import WeightReceiver

            self._rlx_recv = WeightReceiver()
        return self._rlx_recv

    def _rlx_model(self):
        return self.model_runner.get_model()

    def _rlx_quiet_expected_warnings(self) -> None:
        if getattr(self, "_rlx_filter", None) is None:
            tied = bool(getattr(getattr(self._rlx_model(), "config", None), "tie_word_embeddings", False))
            self._rlx_filter = _ExpectedReloadWarnings(tied)
            logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(self._rlx_filter)

    def rlx_sync_begin(self, payload: bytes) -> bytes:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        req = msgspec.msgpack.decode(payload, type=SyncBegin)
        try:
            self._rlx_quiet_expected_warnings()
            self._rlx_finish_reload()  # a sync that was never ended
            self._rlx_receiver().begin(req)
            with set_current_vllm_config(self.vllm_config):
                self._rlx_reloading = True
                initialize_layerwise_reload(self._rlx_model())
            ack = BucketAck(sync_id=req.sync_id, bucket_id=-1, ok=True)
        except Exception as exc:
            self.rlx_sync_abort()
            ack = BucketAck(sync_id=req.sync_id, bucket_id=-1, ok=False, error=f"{type(exc).__name__}: {exc}")
        return msgspec.msgpack.encode(ack)

    def rlx_sync_abort(self) -> None:
        try:
            self._rlx_finish_reload()
        finally:
            receiver, self._rlx_recv = getattr(self, "_rlx_recv", None), None
            if receiver is not None:
                receiver.close()

    def _rlx_finish_reload(self) -> None:
        """Run the reload's post-processing if a reload is in progress (never twice)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        if not getattr(self, "_rlx_reloading", False):
            return
        self._rlx_reloading = False
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(self._rlx_model(), self.model_config)
            _retie_lm_head(self._rlx_model())

    def rlx_sync_bucket(self, payload: bytes) -> bytes:
        from vllm.config import set_current_vllm_config

        meta = msgspec.msgpack.decode(payload, type=SyncBucket).meta
        receiver = self._rlx_receiver()
        try:
            tensors = receiver.tensors(meta)
            with set_current_vllm_config(self.vllm_config):
                self._rlx_model().load_weights(weights=tensors)
            del tensors
            ack = receiver.ack(meta)
        except Exception as exc:  # reported to the sender, which names the server
            ack = BucketAck(sync_id=meta.sync_id, bucket_id=meta.bucket_id, ok=False,
                            error=f"{type(exc).__name__}: {exc}")
        return msgspec.msgpack.encode(ack)

    def rlx_sync_end(self, payload: bytes) -> bytes:
        req = msgspec.msgpack.decode(payload, type=SyncEnd)
        try:
            self._rlx_finish_reload()
            ack = self._rlx_receiver().end(req)
        except Exception as exc:
            ack = BucketAck(sync_id=req.sync_id, bucket_id=-1, ok=False, error=f"{type(exc).__name__}: {exc}")
        return msgspec.msgpack.encode(ack)


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
