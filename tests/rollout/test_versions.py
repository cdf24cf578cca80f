"""Per-token policy versions: a request in flight across a real weight update (pause, sync, resume) on a
real hf rollout server returns each token's version, and its logprobs are those of the weights that
sampled it -- after the update, with the KV cache computed again under the new weights -- so a
trainer-side rollout correction weights each token against the right behaviour policy."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlx.rollout import protocol as p
from rlx.rollout.client import RolloutClient
from rlx.sync.sender import WeightSender
from rlx.trainer.algorithms.correction import rollout_correction
from rlx.trainer.batch import build_batch
from tests.helpers import serve

pytestmark = pytest.mark.slow

NEW_VERSION = 7  # the version the Resume names: the trainer's step, not the server's count of syncs
MIN_TOKENS_AFTER = 5  # tokens sampled after the update, over the samples that span it


@pytest.fixture(scope="module")
def hf_server(tiny_model_dir, tmp_path_factory):
    with serve(tiny_model_dir, "hf", tmp_path_factory.mktemp("versions")) as (address, _):
        yield address


def _models(model_dir):
    """The served weights (v0) and v1: v0 with every value projection scaled, so the keys and values of the
    tokens sampled before the update differ under v1, and a token sampled after it has exactly v1's
    full-forward logprob only if the server computed them again with v1."""
    from transformers import AutoModelForCausalLM

    v0 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    v1 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in v1.model.layers:
            layer.self_attn.v_proj.weight.mul_(1.7)
    return v0, v1


def _logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """Temperature-1 logprob of each completion token from one full forward pass, as a trainer computes it."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)


async def _until_in_flight(client: RolloutClient, request: asyncio.Task) -> None:
    """Until the server holds ``request``, or it has already finished (every sample ended early: then none
    spans the update, and the caller tries another seed)."""
    while not request.done() and (await client.stats())[0].in_flight == 0:
        await asyncio.sleep(0.005)


async def _generate_across_update(address: str, v1, seed: int) -> p.PromptResult:
    client = RolloutClient([address])
    try:
        spec = p.SamplingSpec(n=4, temperature=1.0, max_tokens=150, seed=seed)
        request = asyncio.create_task(client.generate(["12+7="], spec, timeout_s=120))
        await _until_in_flight(client, request)
        await asyncio.sleep(0.05)  # some tokens under v0
        await client.pause()
        with WeightSender(transport="shm", bucket_mb=1, num_buffers=2) as sender:
            await sender.send([(n, t.detach().contiguous()) for n, t in v1.named_parameters()], client.channels())
        await client.broadcast(p.Resume(weight_version=NEW_VERSION))
        result = (await request)[0]
        assert (await client.health())[0].weight_version == NEW_VERSION
        return result
    finally:
        client.close()


def test_sample_across_a_weight_update_carries_both_versions_and_their_logprobs(hf_server, tiny_model_dir):
    v0, v1 = _models(tiny_model_dir)
    spanning, after = [], 0
    for seed in range(1, 7):  # samples may end (eos) before or soon after the update lands; another seed then
        result = asyncio.run(_generate_across_update(hf_server, v1, seed))
        spanning = [s for s in result.samples if 0 in s.versions and NEW_VERSION in s.versions]
        after = sum(len(s.versions) - s.versions.index(NEW_VERSION) for s in spanning)
        if after >= MIN_TOKENS_AFTER:
            break
        asyncio.run(_restore(hf_server, v0))
    assert after >= MIN_TOKENS_AFTER, "too few tokens were sampled after the weight update landed"
    prompt = result.prompt_token_ids
    for sample in result.samples:
        assert len(sample.versions) == len(sample.token_ids) == len(sample.logprobs)
    moved = 0.0  # how far the tokens after the update are from what v0 would have given them
    for sample in spanning:
        split = sample.versions.index(NEW_VERSION)
        assert sample.versions == [0] * split + [NEW_VERSION] * (len(sample.token_ids) - split)
        engine = torch.tensor(sample.logprobs)
        old, new = _logprobs(v0, prompt, sample.token_ids), _logprobs(v1, prompt, sample.token_ids)
        torch.testing.assert_close(engine[:split], old[:split], atol=2e-3, rtol=0)
        torch.testing.assert_close(engine[split:], new[split:], atol=2e-3, rtol=0)
        moved = max(moved, float((engine[split:] - old[split:]).abs().max()))

        # the trainer holds v1: per-token weights are exp(v1 - v0) before the split and 1 after it
        batch = build_batch([prompt], [sample.token_ids], [sample.logprobs], [1.0], pad_id=0)
        weights, metrics = rollout_correction(
            new.unsqueeze(0),
            batch.rollout_logp,
            batch.mask,
            method="tis",
            level="token",
            tis_cap=1e6,
            icepop_low=0.0,
            icepop_high=2.0,
        )
        torch.testing.assert_close(weights[0, :split], (new[:split] - old[:split]).exp(), atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(weights[0, split:], torch.ones(len(sample.token_ids) - split), atol=1e-2, rtol=0)
        assert metrics["logprob_diff_mean"] > 0
    assert moved > 0.05, "the update did not change the sampling policy"


def test_kept_kv_cache_reads_the_old_weights_keys_and_values_after_an_update(tiny_model_dir, tmp_path):
    """``rollout.kv_after_sync=keep``: the tokens after the update come from the new weights reading the keys and
    values the old weights computed before it, and their logprobs are exactly those, not a full forward's."""
    from tests.helpers import serve_with

    v0, v1 = _models(tiny_model_dir)
    with serve_with(tiny_model_dir, tmp_path, "server-keep", rollout={"backend": "hf", "kv_after_sync": "keep"}) as (
        address,
        _,
    ):
        for seed in range(1, 7):
            result = asyncio.run(_generate_across_update(address, v1, seed))
            spanning = [s for s in result.samples if 0 in s.versions and NEW_VERSION in s.versions]
            if sum(len(s.versions) - s.versions.index(NEW_VERSION) for s in spanning) >= MIN_TOKENS_AFTER:
                break
            asyncio.run(_restore(address, v0))
    assert spanning, "no sample spans the weight update"
    prompt, moved = result.prompt_token_ids, 0.0
    for sample in spanning:
        split, tokens = sample.versions.index(NEW_VERSION), sample.token_ids
        engine = torch.tensor(sample.logprobs)
        with torch.no_grad():  # v0's cache up to the token the last v0 step sampled, which v1 then feeds
            cache = v0(input_ids=torch.tensor([prompt + tokens[: split - 1]]), use_cache=True).past_key_values
            logits = v1(input_ids=torch.tensor([tokens[split - 1 : -1]]), past_key_values=cache).logits[0].float()
        kept = logits.log_softmax(-1).gather(-1, torch.tensor(tokens[split:]).unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(engine[:split], _logprobs(v0, prompt, tokens)[:split], atol=2e-3, rtol=0)
        torch.testing.assert_close(engine[split:], kept, atol=2e-3, rtol=0)
        moved = max(moved, float((engine[split:] - _logprobs(v1, prompt, tokens)[split:]).abs().max()))
    assert moved > 0.05, "keeping the old keys and values changed nothing: the test cannot tell keep from recompute"


def test_kept_kv_cache_is_refused_on_vllm():
    from rlx.config.errors import ConfigError
    from rlx.config.rollout import RolloutConfig

    with pytest.raises(ConfigError, match="kv_after_sync=keep needs rollout.backend=hf"):
        RolloutConfig(backend="vllm", kv_after_sync="keep")


async def _restore(address: str, v0) -> None:
    client = RolloutClient([address])
    try:
        with WeightSender(transport="shm", bucket_mb=1, num_buffers=2) as sender:
            await client.pause()
            await sender.send([(n, t.detach().contiguous()) for n, t in v0.named_parameters()], client.channels())
            await client.broadcast(p.Resume(weight_version=0))
    finally:
        client.close()


PAUSE_AFTER_S = (0.05, 0.2, 0.02, 0.5, 0.1, 1.0)
"""How long each try lets a request generate before the pause: a busy host may not have started its samples
after 0.05 s (every token then comes after the update), an idle one may have ended them all after 0.2 s."""


async def _paused_mid_request(client: RolloutClient, seed: int, wait_s: float = 0.05) -> tuple[int, asyncio.Task]:
    """The server's weight version, and an 8-sample request paused (kept) ``wait_s`` after it is in flight. The
    random model ends a sample at eos after a few dozen tokens on average and vLLM on a CPU makes a token in a
    few milliseconds: a pause soon after the request is in flight, and 8 samples, make it likely that one is
    still generating (4 samples and a 0.1 s wait had every sample ended on three seeds once in a while); the
    tests try further seeds, and other waits (``PAUSE_AFTER_S``), where none spans the update."""
    before = (await client.health())[0].weight_version
    spec = p.SamplingSpec(n=8, temperature=1.0, max_tokens=200, seed=seed)
    request = asyncio.create_task(client.generate(["12+7="], spec, timeout_s=120))
    await _until_in_flight(client, request)
    await asyncio.sleep(wait_s)
    await client.pause()
    return before, request


@pytest.fixture(scope="module")
def counting_vllm_server(tiny_model_dir, tmp_path_factory):
    """A vLLM server that counts each request's tokens at every update (``rollout.token_versions=counted``), as
    it must on vLLM 0.25, whose engine labels no output with a version. Its LM head runs through rlx's float32
    head (``rollout.logits_dtype=float32``), so the logprob checks below hold for that path too."""
    from tests.helpers import serve_with

    work = tmp_path_factory.mktemp("counted")
    rollout = {"backend": "vllm", "token_versions": "counted", "logits_dtype": "float32"}
    with serve_with(tiny_model_dir, work, "server-counted", rollout=rollout) as (address, _):
        assert "the LM head computes its logits in float32" in (work / "server-counted.log").read_text()
        yield address


@pytest.fixture(params=["engine", "counted"])
def versions_server(request):
    """Both sources of per-token versions: the engine's labels (newer vLLMs) and rlx's count (vLLM 0.25)."""
    return request.getfixturevalue("vllm_server" if request.param == "engine" else "counting_vllm_server")


@pytest.mark.serial  # a race: the update must land while a sample still generates
def test_vllm_request_kept_across_an_update_returns_the_version_of_each_token(versions_server, tiny_model_dir):
    """The engine's step labels or rlx's count of each request's tokens at the update; the same weights are
    sent, so the shared server serves on unchanged (only its label moves)."""
    vllm_server = versions_server
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)

    async def scenario(seed: int, wait_s: float):
        client = RolloutClient([vllm_server])
        try:
            before, request = await _paused_mid_request(client, seed, wait_s)
            with WeightSender(transport="shm", bucket_mb=1, num_buffers=2) as sender:
                await sender.send(
                    [(n, t.detach().contiguous()) for n, t in model.named_parameters()], client.channels()
                )
            await client.broadcast(p.Resume(weight_version=before + NEW_VERSION))
            return before, (await request)[0]
        finally:
            client.close()

    spanning = []
    for seed, wait_s in zip(range(3, 9), PAUSE_AFTER_S, strict=True):  # every sample may end before the update
        before, result = asyncio.run(scenario(seed, wait_s))  # lands (or start after it); another try then
        after = before + NEW_VERSION
        for sample in result.samples:
            assert len(sample.versions) == len(sample.token_ids)
            split = sample.versions.index(after) if after in sample.versions else len(sample.versions)
            assert sample.versions == [before] * split + [after] * (len(sample.versions) - split)
        spanning = [s for s in result.samples if before in s.versions and after in s.versions]
        if spanning:
            break
    assert spanning, f"no sample spans the update: {[(len(s.token_ids), s.versions[:3]) for s in result.samples]}"


@pytest.mark.serial  # a race: the update must land while a sample still generates
def test_vllm_request_kept_across_an_update_recomputes_its_kv_with_the_new_weights(versions_server, tiny_model_dir):
    """v1 changes every value projection, so the keys and values of the tokens sampled before the update
    differ under v1: a token sampled after it has exactly v1's full-forward logprob only if the engine
    recomputed them. The versions split each sample where the logprobs change from v0's to v1's, so a count
    that were one token off fails here. The shared server gets v0 back at the end."""
    vllm_server = versions_server
    from transformers import AutoModelForCausalLM

    v0 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    v1 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in v1.model.layers:
            layer.self_attn.v_proj.weight.mul_(1.7)

    async def scenario(seed: int, wait_s: float):
        client = RolloutClient([vllm_server])
        try:
            before, request = await _paused_mid_request(client, seed, wait_s)
            with WeightSender(transport="shm", bucket_mb=1, num_buffers=2) as sender:
                await sender.send([(n, t.detach().contiguous()) for n, t in v1.named_parameters()], client.channels())
                await client.broadcast(p.Resume(weight_version=before + 1))
                result = (await request)[0]
                await client.pause()
                await sender.send([(n, t.detach().contiguous()) for n, t in v0.named_parameters()], client.channels())
            return before + 1, result
        finally:
            await client.broadcast(p.Resume())  # the v0 sync counted one more: before + 2
            client.close()

    spanning = []
    for seed, wait_s in zip(range(5, 11), PAUSE_AFTER_S, strict=True):  # a sample may end (eos) before the
        after, result = asyncio.run(scenario(seed, wait_s))  # update lands, or start after it; another try then
        spanning = [s for s in result.samples if after in s.versions and s.versions[0] != after]
        if spanning:
            break
    assert spanning, (
        "no sample was still generating when the weight update landed: "
        f"{[(len(s.token_ids), s.versions[:1], s.versions[-1:]) for s in result.samples]}"
    )
    for sample in spanning:
        split = sample.versions.index(after)
        engine = torch.tensor(sample.logprobs)
        old = _logprobs(v0, result.prompt_token_ids, sample.token_ids)
        new = _logprobs(v1, result.prompt_token_ids, sample.token_ids)
        torch.testing.assert_close(engine[:split], old[:split], atol=2e-3, rtol=0)
        torch.testing.assert_close(engine[split:], new[split:], atol=2e-3, rtol=0)
        assert (new[split:] - old[split:]).abs().max() > 0.05, "v1 did not change the sampling policy"
