"""rlx's ``Trainer.step`` against a plain transformers training loop, on the same tokens (GPU).

The rival is what a user writes by hand: micro-batches of padded rows, ``model(...).logits``,
float32 log-softmax of the completion positions, a token-mean policy-gradient loss over the
completion tokens, backward, gradient clipping and AdamW. Both train the same random-weight
model (Qwen3-0.6B shape by default, bf16, built from a config dict: nothing is downloaded)
from the same batch, with gradient checkpointing on and off, in alternating rounds.

Shapes: 64 rows of 256 + 1024 tokens (micro-batch 8 rows), 64 rows whose completion lengths
are uniform in [128, 1024] (the padded batch the rival runs is a third padding), and 2 rows
of 1024 + 15360 tokens (micro-batch 1 row), and GRPO groups: 8 prompts of 1024 tokens with 8
samples each, completions uniform in [128, 512]. Token rates count real tokens only (prompt +
completion, no padding) of the samples as given, each sample with its prompt, so on the GRPO
shape rlx's shared prompts (computed once per group) show as a higher rate on the same samples;
MFU counts the tokens each side actually puts through the model. "update" is forward + backward + optimizer step; "step"
is the whole ``Trainer.step`` (plan, logprob pass when there is one, advantages, update). MFU is 6 * params * update
tokens/s against the bf16 matmul peak measured in the same run. Peak memory is the step's own: the most allocated above
what was allocated when it began (both models and their optimizer states stay resident all along).

    python benchmarks/bench_trainer.py [--rounds 3] [--json docs/results/bench_trainer_h100.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from rlx.config.roles import trainer_role

QWEN3_0P6B = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
}
SHAPES = {  # rows, prompt tokens, (min, max) completion tokens, rows per plain micro-batch, rlx token budget,
    # rows per prompt (GRPO groups: 8 samples of each prompt; 1: every row its own prompt)
    "64x1280": (64, 256, (1024, 1024), 8, 8 * 1280, 1),
    "64 varlen 128-1024": (64, 256, (128, 1024), 8, 8 * 1280, 1),
    "2x16k": (2, 1024, (15360, 15360), 1, 16384, 1),
    "8 groups x 8, 1024 + 128-512": (64, 1024, (128, 512), 8, 16384, 8),
}


def build_model_dir(out: Path, config: dict) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlx.trainer.tiny import build_tokenizer

    torch.manual_seed(0)
    hf_config = AutoConfig.for_model(**config)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    build_tokenizer(out)  # rlx checks a model directory has one; the token ids here are random
    return out


def make_batch(shape: str, vocab: int, seed: int = 0):
    from rlx.trainer.batch import build_batch

    rows, prompt_len, (low, high), _, _, group = SHAPES[shape]
    gen = torch.Generator().manual_seed(seed)
    prompts = [
        p
        for _ in range(rows // group)
        for p in [torch.randint(10, vocab, (prompt_len,), generator=gen).tolist()]
        for _ in range(group)
    ]
    lengths = torch.randint(low, high + 1, (rows,), generator=gen).tolist()
    completions = [torch.randint(10, vocab, (n,), generator=gen).tolist() for n in lengths]
    logps = [(-torch.rand(n, generator=gen) * 3).tolist() for n in lengths]
    rewards = torch.randint(0, 2, (rows,), generator=gen).float().tolist()
    return build_batch(prompts, completions, logps, rewards, pad_id=0)


class PlainLoop:
    """The hand-written rival: padded micro-batches, full logits, float32 log-softmax, AdamW."""

    def __init__(self, model_dir: Path, checkpointing: bool, rows_per_batch: int, lr: float) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.bfloat16, attn_implementation="sdpa"
        ).cuda()
        self.model.config.use_cache = False
        if checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.rows_per_batch = rows_per_batch

    def step(self, batch) -> float:
        advantages = batch.rewards - batch.rewards.mean()
        total = batch.mask.sum().cuda()
        num_completion = batch.completion_ids.shape[1]
        for start in range(0, batch.size, self.rows_per_batch):
            mb = batch.rows(slice(start, start + self.rows_per_batch)).to(torch.device("cuda"))
            logits = self.model(
                input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids
            ).logits
            logp = logits[:, -num_completion - 1 : -1].float().log_softmax(-1)
            logp = logp.gather(-1, mb.completion_ids.unsqueeze(-1)).squeeze(-1)
            adv = advantages[start : start + self.rows_per_batch].cuda().unsqueeze(-1)
            loss = -(adv * logp * mb.mask).sum() / total
            loss.backward()
            del logits, logp
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss)


def rlx_trainer(model_dir: Path, checkpointing: bool, shape: str, lr: float):
    from rlx.config.algorithm import AlgorithmConfig
    from rlx.config.model import ModelConfig
    from rlx.config.schema import RunConfig
    from rlx.config.trainer import TrainerConfig
    from rlx.trainer.trainer import Trainer

    rows, _, (_, high), rows_per_batch, budget, _ = SHAPES[shape]
    n = min(rows, 8)
    cfg = RunConfig(
        model=ModelConfig(path=str(model_dir), dtype="bfloat16", gradient_checkpointing=checkpointing),
        algorithm=AlgorithmConfig(loss_agg="token_mean"),
        trainer=TrainerConfig(
            device="cuda",
            prompts_per_step=rows // n,
            micro_batch_size=rows_per_batch,
            micro_batch_tokens=budget,
            lr=lr,
            skip_no_signal=False,
        ),
    )  # every token through, as the plain loop
    cfg.rollout.n = n
    cfg.rollout.max_tokens = high
    return Trainer(trainer_role(cfg))


def timed(fn) -> tuple[float, float, object]:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, (torch.cuda.max_memory_allocated() - base) / 2**30, out


def run_shape(model_dir: Path, shape: str, checkpointing: bool, rounds: int, vocab: int) -> dict:
    batch = make_batch(shape, vocab)
    real_tokens = float(batch.attention_mask.sum())
    padded_tokens = float(batch.input_ids.numel())
    plain = PlainLoop(model_dir, checkpointing, SHAPES[shape][3], lr=1e-6)
    trainer = rlx_trainer(model_dir, checkpointing, shape, lr=1e-6)
    times: dict[str, list] = {"plain": [], "rlx": [], "rlx_update": []}
    memory = {"plain": 0.0, "rlx": 0.0}
    errors = {}
    computed = real_tokens
    for round_index in range(rounds + 1):  # round 0 warms up
        order = ("plain", "rlx") if round_index % 2 == 0 else ("rlx", "plain")
        for name in order:
            if name in errors:
                continue
            try:
                seconds, peak, out = timed(partial(plain.step if name == "plain" else trainer.step, batch))
            except torch.OutOfMemoryError as exc:
                errors[name] = f"out of memory: {str(exc).splitlines()[0][:120]}"
                (plain.optimizer if name == "plain" else trainer.optimizer).zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                continue
            if round_index == 0:
                continue
            times[name].append(seconds)
            memory[name] = max(memory[name], peak)
            if name == "rlx":
                times["rlx_update"].append(out["time_update"])
                computed = out["update_tokens"]
    del plain, trainer
    torch.cuda.empty_cache()
    result = {
        "shape": shape,
        "gradient_checkpointing": checkpointing,
        "real_tokens": real_tokens,
        "padded_tokens": padded_tokens,
        "errors": errors,
    }
    for name, key in (("plain", "plain"), ("rlx", "rlx_update")):
        if times[key]:
            result[f"{name}_update_tok_s"] = real_tokens / statistics.median(times[key])
            result[f"{name}_peak_gib"] = memory[name]
            work = computed if name == "rlx" else real_tokens  # tokens through the model (a shared prompt once)
            result[f"{name}_computed_tok_s"] = work / statistics.median(times[key])
    if times["rlx"]:
        result["rlx_step_tok_s"] = real_tokens / statistics.median(times["rlx"])
    if times["plain"]:
        result["plain_step_tok_s"] = result["plain_update_tok_s"]
    result["rounds"] = {k: v for k, v in times.items()}
    return result


def main() -> None:
    from gpu_train_report import bf16_peak_tflops
    from rich.console import Console
    from rich.table import Table

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per method (after one warm-up)")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    peak = bf16_peak_tflops()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model_dir(Path(tmp) / "model", QWEN3_0P6B)
        params = sum(t.numel() for t in _load_meta(model_dir).parameters())
        for shape in args.shapes:
            for checkpointing in (True, False):
                result = run_shape(model_dir, shape, checkpointing, args.rounds, QWEN3_0P6B["vocab_size"])
                for name in ("plain", "rlx"):
                    if f"{name}_update_tok_s" in result:
                        result[f"{name}_mfu"] = 6 * params * result[f"{name}_computed_tok_s"] / 1e12 / peak
                results.append(result)
                print(json.dumps({k: v for k, v in result.items() if k != "rounds"}), flush=True)
    table = Table(
        title=f"Trainer.step vs a plain transformers loop, {torch.cuda.get_device_name()} "
        f"({params / 1e6:.0f}M params, bf16 peak {peak:.0f} TFLOP/s measured)"
    )
    for column in (
        "shape",
        "grad ckpt",
        "pad %",
        "plain update tok/s",
        "rlx update tok/s",
        "rlx / plain",
        "rlx step tok/s",
        "MFU plain / rlx",
        "peak GiB plain / rlx",
    ):
        table.add_column(column, justify="right")
    for r in results:
        plain_rate, rlx_rate = r.get("plain_update_tok_s"), r.get("rlx_update_tok_s")
        table.add_row(
            r["shape"],
            "on" if r["gradient_checkpointing"] else "off",
            f"{100 * (1 - r['real_tokens'] / r['padded_tokens']):.0f}",
            _fmt(plain_rate, "{:,.0f}", r["errors"].get("plain")),
            _fmt(rlx_rate, "{:,.0f}"),
            _fmt(rlx_rate / plain_rate if plain_rate and rlx_rate else None, "{:.2f}"),
            _fmt(r.get("rlx_step_tok_s"), "{:,.0f}"),
            f"{_fmt(r.get('plain_mfu'), '{:.1%}')} / {_fmt(r.get('rlx_mfu'), '{:.1%}')}",
            f"{_fmt(r.get('plain_peak_gib'), '{:.1f}')} / {_fmt(r.get('rlx_peak_gib'), '{:.1f}')}",
        )
    Console().print(table)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "device": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "params": params,
                    "bf16_peak_tflops": peak,
                    "model": QWEN3_0P6B,
                    "results": results,
                },
                indent=2,
            )
        )


def _load_meta(model_dir: Path):
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))


def _fmt(value, pattern: str, error: str | None = None) -> str:
    if value is None:
        return "OOM" if error and "memory" in error else "-"
    return pattern.format(value)


if __name__ == "__main__":
    main()
