import json
import subprocess
import sys
import textwrap

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
    new = out[0, prompt["input_ids"].shape[1]:]
    assert 1 <= new.numel() <= 6
    with torch.no_grad():
        logits = model(**prompt).logits
    assert torch.isfinite(logits).all()


@pytest.mark.slow
def test_tiny_model_loads_and_generates_in_vllm(tiny_model_dir, tmp_path):
    script = tmp_path / "gen.py"
    script.write_text(textwrap.dedent(f"""
        import json, math
        if __name__ == "__main__":
            from vllm import LLM, SamplingParams
            llm = LLM(model={str(tiny_model_dir)!r}, gpu_memory_utilization=0.2, max_model_len=256,
                      enforce_eager=True, seed=0, dtype="float32")
            params = SamplingParams(max_tokens=8, temperature=1.0, logprobs=0, n=2, seed=0)
            out = llm.generate(["3+4=", "10-2="], params)
            result = [[{{"ids": list(c.token_ids), "lp": [next(iter(d.values())).logprob for d in c.logprobs]}}
                       for c in o.outputs] for o in out]
            print("RESULT" + json.dumps(result))
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    result = json.loads(line[len("RESULT"):])
    assert len(result) == 2 and all(len(samples) == 2 for samples in result)
    for samples in result:
        for sample in samples:
            assert 1 <= len(sample["ids"]) <= 8
            assert len(sample["lp"]) == len(sample["ids"])
            assert all(lp <= 0.0 and lp > -1e4 for lp in sample["lp"])
