"""The hf backend computes a prompt's keys and values once for its n samples: a real `rlx rollout-serve`
gives the tokens and logprobs that transformers' own generate gives with the prompt repeated n times."""

import asyncio

import torch

from rlx.config.schema import ModelConfig
from rlx.rollout import protocol as p
from rlx.rollout.client import RolloutClient
from tests.helpers import serve_with


def reference(model_dir, prompt_ids: list[int], n: int, max_tokens: int, seed: int):
    """transformers' generate with ``num_return_sequences=n`` (the prompt expanded before its prefill), no top-k
    (top_k=None: without it generate keeps the 50 likeliest tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, ModelConfig(path=str(model_dir)).engine_dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                             do_sample=True, temperature=1.0, top_p=1.0, top_k=None, max_new_tokens=max_tokens,
                             num_return_sequences=n, output_scores=True, return_dict_in_generate=True,
                             pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    tokens = out.sequences[:, len(prompt_ids):]
    logps = torch.stack(out.scores, dim=1).float().log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens.tolist(), logps


def test_shared_prefill_samples_what_a_repeated_prompt_samples(tiny_model_dir, tmp_path):
    prompt, n, max_tokens, seed = [5, 6, 14, 7, 9, 11, 4], 6, 8, 1234
    sampling = p.SamplingSpec(n=n, temperature=1.0, max_tokens=max_tokens, seed=seed)

    async def ask(address):
        client = RolloutClient([address])
        try:
            return await client.generate([prompt], sampling)
        finally:
            client.close()

    with serve_with(tiny_model_dir, tmp_path, "hf", rollout={"backend": "hf"}) as (address, _):
        result = asyncio.run(ask(address))[0]
    tokens, logps = reference(tiny_model_dir, prompt, n, max_tokens, seed)
    assert len(result.samples) == n
    assert len({tuple(s.token_ids) for s in result.samples}) > 1  # n different samples, not one copied
    for sample, want, want_logp in zip(result.samples, tokens, logps):
        assert sample.token_ids == want[:len(sample.token_ids)]
        assert len(sample.token_ids) == max_tokens or sample.finish_reason == "stop"
        torch.testing.assert_close(torch.tensor(sample.logprobs), want_logp[:len(sample.token_ids)],
                                   rtol=1e-4, atol=1e-4)
