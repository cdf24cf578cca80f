"""The hf backend's sampling on a real `rlx rollout-serve`: each prompt's prefill is computed once for its n
samples and the logprobs are the model's; every sample draws from its own seeded stream, so a request gets the
same samples whichever other requests share its batch; top-k and temperature act as asked."""

import asyncio

import pytest
import torch

from rlx.rollout import protocol as p
from rlx.rollout.client import RolloutClient
from tests.helpers import serve_with

PROMPTS = [[5, 6, 14, 7, 9, 11, 4], [8, 9], [12, 5, 7, 7, 30, 31, 6, 6, 9, 10, 11]]


@pytest.fixture(scope="module")
def hf_server(tiny_model_dir, tmp_path_factory):
    with serve_with(tiny_model_dir, tmp_path_factory.mktemp("hf-sampling"), "hf", rollout={"backend": "hf"}) as served:
        yield served[0]


async def _ask(
    address: str, requests: list[tuple[list[int], p.SamplingSpec]], queue_behind_busy: bool = False
) -> list[p.PromptResult]:
    """The requests sent together; ``queue_behind_busy``: while the server runs a long request, so they wait in
    its queue and run as one batch."""
    client = RolloutClient([address])
    try:
        busy = None
        if queue_behind_busy:
            long = p.SamplingSpec(n=8, temperature=1.0, max_tokens=400, seed=9)
            busy = asyncio.create_task(client.generate([[4] * 200], long))
            while (await client.stats())[0].in_flight == 0:
                await asyncio.sleep(0.005)
        results = await asyncio.gather(*(client.generate([prompt], spec) for prompt, spec in requests))
        if busy is not None:
            await busy
        return [r[0] for r in results]
    finally:
        client.close()


def _full_forward_logprobs(model, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    return (logits / temperature).log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def test_samples_carry_the_models_logprobs_with_the_prompt_prefilled_once(hf_server, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    spec = p.SamplingSpec(n=6, temperature=0.8, max_tokens=8, seed=1234)
    results = asyncio.run(_ask(hf_server, [(prompt, spec) for prompt in PROMPTS]))  # one batch, padded prompts
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert len(result.samples) == 6
        assert len({tuple(s.token_ids) for s in result.samples}) > 1  # n different samples, not one copied
        for sample in result.samples:
            want = _full_forward_logprobs(model, prompt, sample.token_ids, 0.8)
            torch.testing.assert_close(torch.tensor(sample.logprobs), want, rtol=1e-4, atol=1e-4)


def test_a_requests_samples_do_not_depend_on_the_batch_it_runs_in(hf_server):
    spec = p.SamplingSpec(n=4, temperature=1.0, max_tokens=8, seed=77)
    alone = asyncio.run(_ask(hf_server, [(PROMPTS[0], spec)]))[0]
    others = [
        (PROMPTS[1], p.SamplingSpec(n=4, temperature=1.0, max_tokens=8, seed=5)),
        (PROMPTS[2], p.SamplingSpec(n=4, temperature=1.0, max_tokens=8, seed=None)),
    ]
    batched = asyncio.run(_ask(hf_server, [*others, (PROMPTS[0], spec)], queue_behind_busy=True))[-1]
    again = asyncio.run(_ask(hf_server, [(PROMPTS[0], spec)]))[0]
    for a, b, c in zip(alone.samples, batched.samples, again.samples, strict=True):
        assert a.token_ids == b.token_ids == c.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=1e-4, atol=1e-4)
    assert len({tuple(s.token_ids) for s in alone.samples}) > 1


def test_top_k_one_samples_the_greedy_tokens(hf_server):
    greedy = asyncio.run(_ask(hf_server, [(PROMPTS[0], p.SamplingSpec(n=1, temperature=0.0, max_tokens=8))]))[0]
    top1 = asyncio.run(
        _ask(hf_server, [(PROMPTS[0], p.SamplingSpec(n=3, temperature=1.0, top_k=1, max_tokens=8, seed=3))])
    )[0]
    for sample in top1.samples:
        assert sample.token_ids == greedy.samples[0].token_ids
        assert all(abs(lp) < 1e-6 for lp in sample.logprobs)  # one token left: probability 1


def test_requests_sent_together_run_as_one_generate_call(hf_server):
    """A step sends one request per prompt, a fraction of a millisecond apart: the first waits for the others
    instead of starting a call alone, so all of them come back from one batch (one batch's time each)."""
    specs = [p.SamplingSpec(n=4, temperature=1.0, max_tokens=16, seed=s) for s in range(len(PROMPTS) + 1)]
    for _ in range(2):  # the first round also warms the server, so nothing else is queued
        results = asyncio.run(_ask(hf_server, [(PROMPTS[i % len(PROMPTS)], spec) for i, spec in enumerate(specs)]))
    assert len({r.generate_s for r in results}) == 1, [r.generate_s for r in results]


def test_requests_said_to_come_together_wait_for_each_other(hf_server):
    """A client computing beside its requests can send them further apart than the server's quiet gap; told how
    many it sends at once (``together``), the server waits for all of them and runs them as one call."""
    specs = [p.SamplingSpec(n=4, temperature=1.0, max_tokens=16, seed=s) for s in range(4)]

    async def staggered(together: int) -> list[p.PromptResult]:
        client = RolloutClient([hf_server])
        try:
            tasks = []
            for i, spec in enumerate(specs):
                tasks.append(asyncio.create_task(client.generate([PROMPTS[i % len(PROMPTS)]], spec, together=together)))
                await asyncio.sleep(0.015)  # three times the quiet gap
            return [r[0] for r in await asyncio.gather(*tasks)]
        finally:
            client.close()

    assert len({r.generate_s for r in asyncio.run(staggered(0))}) > 1  # without the count: calls of their own
    assert len({r.generate_s for r in asyncio.run(staggered(len(specs)))}) == 1


@pytest.mark.parametrize("vocab", [128, 1 << 15])  # every step drawn at once; two steps per draw
def test_noise_drawn_ahead_gives_the_tokens_of_one_draw_per_step(vocab):
    """The sampler draws several steps' noise per row at once; on a CPU the tokens and logprobs are exactly
    those of drawing each step's noise from the row's generator when the step comes."""
    from rlx.rollout.backends.hf import NOISE_PER_ROW, _RowSampler

    steps, seeds = 9, [3, 77, 1 << 40]
    assert NOISE_PER_ROW // vocab in (2, NOISE_PER_ROW // 128)
    spec = p.SamplingSpec(n=1, temperature=1.0, max_tokens=steps, seed=0)
    sampler = _RowSampler(seeds, spec, "cpu")
    reference = [torch.Generator().manual_seed(seed) for seed in seeds]
    scores = torch.randn(steps, len(seeds), vocab, generator=torch.Generator().manual_seed(5))
    for step in range(steps):
        onehot = sampler(None, scores[step])
        logp = scores[step].log_softmax(-1)
        uniform = torch.stack([torch.rand(vocab, generator=g) for g in reference])
        want = (logp - torch.log(-torch.log(uniform.clamp(min=1e-20)))).argmax(-1)
        assert torch.equal(onehot.argmax(-1), want)
        assert torch.isinf(onehot).sum() == len(seeds) * (vocab - 1)
        torch.testing.assert_close(sampler.logprobs[step], logp.gather(-1, want[:, None]).squeeze(-1))


def test_a_pad_token_the_model_draws_is_one_of_the_samples_tokens(hf_server, tiny_model_dir):
    """generate writes pad after a row has finished; a pad the row drew itself, before its EOS, is a token like any
    other (vLLM keeps it too): the sample goes on past it, with the model's logprobs for what follows."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    spec = p.SamplingSpec(n=16, temperature=1.0, max_tokens=96, seed=11)
    results = asyncio.run(_ask(hf_server, [(prompt, spec) for prompt in PROMPTS]))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    drew_pad = [
        (prompt, s) for prompt, r in zip(PROMPTS, results, strict=True) for s in r.samples if pad in s.token_ids[:-1]
    ]
    assert drew_pad, "the random model drew no pad in 48 samples of 96 tokens"
    for prompt, sample in drew_pad:
        assert len(sample.logprobs) == len(sample.token_ids) == len(sample.versions)
        want = _full_forward_logprobs(model, prompt, sample.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(sample.logprobs), want, rtol=1e-4, atol=1e-4)
    finished = [s for r in results for s in r.samples if s.finish_reason == "stop"]
    assert finished and all(s.token_ids[-1] == eos for s in finished)  # EOS kept, no pad after it
