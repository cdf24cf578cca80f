import json

import pytest


def test_tokenizer_is_character_level_and_round_trips(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "12+7=19\nWhat is 3*4? 12"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.eos_token_id == 2 and tok.pad_token_id == 0


def test_tiny_model_is_a_normal_hf_dir_and_generates(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("config.json", "tokenizer.json", "model.safetensors", "generation_config.json"):
        assert (tiny_model_dir / name).is_file(), name
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["num_hidden_layers"] == 2
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompt = tok("3+4=", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=6, do_sample=False)
    new = out[0, prompt["input_ids"].shape[1] :]
    assert 1 <= new.numel() <= 6
    with torch.no_grad():
        logits = model(**prompt).logits
    assert torch.isfinite(logits).all()


@pytest.mark.slow
def test_tiny_model_loads_and_generates_in_vllm(vllm_server, tiny_model_dir):
    """The shared server runs vLLM on the kit-built directory; greedy output decodes to text."""
    import asyncio
    import math

    from rlx.rollout import protocol as p
    from rlx.rollout.client import RolloutClient

    async def go():
        client = RolloutClient([vllm_server])
        try:
            health = await client.health()
            results = await client.generate(["3+4=", "10-2="], p.SamplingSpec(n=2, max_tokens=8, seed=0))
            return health[0], results
        finally:
            client.close()

    health, results = asyncio.run(go())
    assert health.backend == "vllm" and health.model == str(tiny_model_dir)
    for result in results:
        assert len(result.samples) == 2
        for sample in result.samples:
            assert 1 <= len(sample.token_ids) <= 8 and len(sample.logprobs) == len(sample.token_ids)
            assert all(math.isfinite(lp) for lp in sample.logprobs)
