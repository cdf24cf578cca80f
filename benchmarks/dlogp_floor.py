"""The train/rollout logprob mismatch that bfloat16 alone causes, without vLLM: transformers scores the same sampled
completions with the float32 model, with its weights rounded to bfloat16 (computing in float32), and with weights
and compute in bfloat16. Mean |dlogp| against float32 for each: the floor under what a bfloat16 engine can reach
against a float32 trainer, whatever its kernels.

    python benchmarks/dlogp_floor.py MODEL_DIR [--prompts 32] [--max-tokens 48] [--json OUT]

Prompts: reasoning-gym chain_sum problems through the model's chat template (as configs/gpu_smollm2_*.yaml ask
them), sampled at temperature 1 by the float32 model. Runs on a CPU in about a minute for SmolLM2-135M.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

SYSTEM = "Reply with only the final number."


def problems(count: int) -> list[str]:
    import reasoning_gym

    data = reasoning_gym.create_dataset(
        "chain_sum", size=count, seed=1, min_terms=2, max_terms=2, min_digits=1, max_digits=2
    )
    return [entry["question"] for entry in data]


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    tok = AutoTokenizer.from_pretrained(args.model)
    full = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    variants = {
        "bfloat16 weights, float32 compute": AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32),
        "bfloat16 weights and compute": AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16),
    }
    with torch.no_grad():
        for param in variants["bfloat16 weights, float32 compute"].parameters():
            param.copy_(param.to(torch.bfloat16).float())
    diffs: dict[str, list[float]] = {name: [] for name in variants}
    torch.manual_seed(0)
    for question in problems(args.prompts):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = full.generate(
                ids, do_sample=True, temperature=1.0, max_new_tokens=args.max_tokens, pad_token_id=tok.eos_token_id
            )
            completion = out[0, ids.shape[1] :]

            def logprobs(model, out=out, completion=completion, start=ids.shape[1]):
                logits = model.eval()(out).logits[0, start - 1 : -1].float()
                return torch.log_softmax(logits, -1).gather(-1, completion[:, None])[:, 0]

            reference = logprobs(full)
            for name, model in variants.items():
                diffs[name] += (logprobs(model) - reference).abs().tolist()
    rows = [{"variant": name, "dlogp_mean": statistics.fmean(d), "tokens": len(d)} for name, d in diffs.items()]
    for row in rows:
        print(f"{row['variant']:<36} mean |dlogp| against float32: {row['dlogp_mean']:.4f} ({row['tokens']} tokens)")
    if args.json:
        report = {
            "model": args.model.name,
            "prompts": args.prompts,
            "max_tokens": args.max_tokens,
            "torch": torch.__version__,
            "rows": rows,
            "command": f"python benchmarks/dlogp_floor.py MODEL_DIR --prompts {args.prompts} "
            f"--max-tokens {args.max_tokens}",
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
