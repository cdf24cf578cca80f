"""The vLLM worker extension's reload around a sync: the warnings it drops, and the ties it restores.

``tied_head`` and ``retie`` read the tie off the engine's model; the shapes vLLM's model classes take are built
here from plain modules (a head module tied to the embedding, as Llama's and vLLM 0.32's Qwen2 are; the embedding
module itself as the head, as vLLM 0.25's Qwen2 is), and a real engine of every family
runs the sync in tests/launch/test_families.py.
"""

import logging
from types import SimpleNamespace

import pytest
import torch

from rlx.rollout.backends.vllm import _ExpectedReloadWarnings, retie, tied_head


def record(layer: str, msg: str = "%s: Failed to load weights") -> logging.LogRecord:
    return logging.LogRecord(
        "vllm.model_executor.model_loader.reload.layerwise", logging.WARNING, __file__, 1, msg, (layer,), None
    )


def test_rotary_and_a_tied_head_are_quiet_and_everything_else_is_reported():
    tied, untied = _ExpectedReloadWarnings({"ParallelLMHead"}), _ExpectedReloadWarnings(set())
    assert not tied.filter(record("RotaryEmbedding")) and not tied.filter(record("Llama3RotaryEmbedding"))
    assert not tied.filter(record("ParallelLMHead"))
    assert untied.filter(record("ParallelLMHead"))  # an untied head that missed its weights is a real problem
    assert tied.filter(record("QKVParallelLinear")) and tied.filter(record("VocabParallelEmbedding"))
    assert tied.filter(record("RotaryEmbedding", msg="%s: Delayed processing"))


class Head(torch.nn.Module):
    """A head module of its own, with vLLM's post-processing hook (counted); ``tie_weights`` as vLLM's
    ``ParallelLMHead`` has it, or none."""

    def __init__(self, weight: torch.nn.Parameter, api: bool) -> None:
        super().__init__()
        self.weight = weight
        self.quant_method = self
        self.processed = 0
        if api:
            self.tie_weights = lambda embedding: setattr(self, "weight", embedding.weight) or self

    def process_weights_after_loading(self, layer) -> None:
        assert layer is self
        self.processed += 1


class Model(torch.nn.Module):
    def __init__(self, head: str, tied: bool = True) -> None:
        super().__init__()
        self.config = SimpleNamespace(tie_word_embeddings=tied)
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(16, 4)
        embed = self.model.embed_tokens
        if head == "the embedding":
            self.lm_head = embed
        else:
            self.lm_head = Head(embed.weight if tied else torch.nn.Parameter(torch.zeros(16, 4)), head == "tie_weights")


def reload(model: Model) -> None:
    """What a layerwise reload does to a tied head module no tensor names: its old tensor put back, untied."""
    model.model.embed_tokens.weight = torch.nn.Parameter(torch.ones(16, 4))  # the synced embedding
    if model.lm_head is not model.model.embed_tokens:
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())


@pytest.mark.parametrize("head", ["tie_weights", "a plain head module"])
def test_a_head_module_of_its_own_is_tied_again_after_the_reload(head):
    model = Model(head)
    tied = tied_head(model)
    assert tied == (model.lm_head, model.model.embed_tokens)
    reload(model)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    retie(*tied)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, torch.ones(16, 4)) and model.lm_head.processed == 1


def test_the_embedding_as_head_and_an_untied_head_need_no_retie():
    same, untied = Model("the embedding"), Model("tie_weights", tied=False)
    assert tied_head(same) is None and tied_head(untied) is None
    reload(same)
    assert torch.equal(same.lm_head.weight, torch.ones(16, 4))  # the head is the embedding: the sync loaded it


def test_a_tied_model_without_an_embedding_to_tie_to_is_named():
    model = Model("tie_weights")
    del model.model.embed_tokens
    with pytest.raises(RuntimeError, match="Model ties its LM head to its embeddings"):
        tied_head(model)
