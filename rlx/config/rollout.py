"""The ``rollout`` section (rollout servers and their engines) and ``SamplingConfig``, the read-only view of its
sampling keys that the collector and the trainer both read."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from rlx.config.checks import MIN_TEMPERATURE, check_choice, check_range
from rlx.config.errors import ConfigError
from rlx.config.store import check_reuse


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

    def as_dict(self) -> dict:
        """The sampling keys as plain values (``stop`` a list): what a request or a manifest records of them."""
        return {**asdict(self), "stop": list(self.stop)}

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
    engine_weights: str = "model"
    """Where the engines the run launches take their weights: model = they load model.path; first_sync = they start
    with placeholder weights (vLLM's ``load_format=dummy``: no read of the checkpoint, seconds fewer at start for a
    large model) and the run's first sync, before any generation or evaluation, loads the trainer's, verified where
    sync.verify is on. vLLM only; not with model.lora.sync=adapter (the engine would hold no base weights).
    Servers in rollout.servers, and a server started by hand, always load model.path."""
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
        keys = {f.name: getattr(self, f.name) for f in fields(SamplingConfig)}
        return SamplingConfig(**{**keys, "stop": tuple(self.stop)})

    @property
    def servers_to_launch(self) -> int:
        if self.num_servers is not None:
            return self.num_servers
        return 0 if self.servers else 1

    def __post_init__(self) -> None:
        check_choice("rollout.backend", self.backend, BACKEND_CHOICES)
        self._check_servers()
        self._check_sampling()
        self._check_engine()
        self._check_endpoints()
        check_reuse(self)

    def _check_servers(self) -> None:
        """Which servers generate, and how long each may take to start and to answer."""
        if self.num_servers is not None:
            check_range("rollout.num_servers", self.num_servers, 0)
        if self.servers_to_launch + len(self.servers) == 0:
            raise ConfigError(
                "rollout.num_servers=0 and rollout.servers is empty: no server would generate; "
                "list running servers in rollout.servers or launch some with rollout.num_servers"
            )
        for address in self.servers:
            if not address.startswith(("tcp://", "ipc://")):
                raise ConfigError(f"rollout.servers entry {address!r} must start with tcp:// or ipc://")
        check_range("rollout.request_timeout_s", self.request_timeout_s, 0.1)
        check_range("rollout.startup_timeout_s", self.startup_timeout_s, 0.1)
        check_range(
            "rollout.max_restarts",
            self.max_restarts,
            0,
            hint="set rollout.max_restarts to the restarts allowed per launched server",
        )

    def _check_sampling(self) -> None:
        """The sampling keys, and that a completion fits the context beside its prompt."""
        check_range("rollout.n", self.n, 1, hint="set rollout.n to the samples per prompt")
        check_range("rollout.temperature", self.temperature, 0.0)
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            raise ConfigError(
                f"rollout.temperature={self.temperature!r} is below {MIN_TEMPERATURE}: dividing the "
                "logits by it overflows and the logprobs come out NaN; set rollout.temperature=0 for "
                f"greedy decoding or a value >= {MIN_TEMPERATURE}"
            )
        check_range("rollout.top_p", self.top_p, 0.0, 1.0)
        check_range("rollout.top_k", self.top_k, -1, hint="-1 turns top-k sampling off")
        check_range("rollout.max_tokens", self.max_tokens, 1)
        check_range("rollout.max_model_len", self.max_model_len, 2)
        if self.max_tokens >= self.max_model_len:
            raise ConfigError(
                f"rollout.max_tokens={self.max_tokens} with rollout.max_model_len={self.max_model_len}: "
                "the prompt and its completion share the context, so no prompt would fit; set "
                "rollout.max_tokens below rollout.max_model_len, or raise rollout.max_model_len"
            )

    def _check_engine(self) -> None:
        """The engine's device, memory, parallelism and what it does across a weight update."""
        check_choice("rollout.device", self.device, ("auto", "cpu", "cuda"))
        check_choice("rollout.engine_weights", self.engine_weights, ("model", "first_sync"))
        if self.engine_weights == "first_sync" and self.backend != "vllm":
            raise ConfigError(
                "rollout.engine_weights=first_sync needs rollout.backend=vllm (the hf backend loads its model as it "
                "starts); set rollout.engine_weights=model or rollout.backend=vllm"
            )
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

    def _check_endpoints(self) -> None:
        """The ports a launched server binds."""
        check_range("rollout.port", self.port, 0, 65535)
        check_range("rollout.openai_port", self.openai_port, 0, 65535)
        check_range(
            "rollout.openai_max_body_mb",
            self.openai_max_body_mb,
            0.001,
            hint="set it to the largest chat request body the endpoint reads, in MiB",
        )
