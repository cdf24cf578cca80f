"""The vLLM worker extension drops only the reload warnings every sync produces by design."""

import logging

from rlx.rollout.backends.vllm import _ExpectedReloadWarnings


def record(layer: str, msg: str = "%s: Failed to load weights") -> logging.LogRecord:
    return logging.LogRecord(
        "vllm.model_executor.model_loader.reload.layerwise", logging.WARNING, __file__, 1, msg, (layer,), None
    )


def test_rotary_and_a_tied_head_are_quiet_and_everything_else_is_reported():
    tied, untied = _ExpectedReloadWarnings(tied_head=True), _ExpectedReloadWarnings(tied_head=False)
    assert not tied.filter(record("RotaryEmbedding")) and not tied.filter(record("Llama3RotaryEmbedding"))
    assert not tied.filter(record("ParallelLMHead"))
    assert untied.filter(record("ParallelLMHead"))  # an untied head that missed its weights is a real problem
    assert tied.filter(record("QKVParallelLinear")) and tied.filter(record("VocabParallelEmbedding"))
    assert tied.filter(record("RotaryEmbedding", msg="%s: Delayed processing"))
