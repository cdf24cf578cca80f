"""transformers backend: batched ``generate`` for machines without vLLM (e.g. a torch-only GPU box).

Requests queue up; a batcher waits a few milliseconds for requests sent together, takes up to
``MAX_BATCH_PROMPTS`` prompts with the same sampling parameters, left-pads them and runs one
``generate`` call in a worker thread. Each prompt's prefill is computed once for its ``n``
samples, and each sample draws its tokens from its own random stream (its request's seed plus its
index, ``_RowSampler``), so what a request gets does not depend on the batch it ran in. Logprobs
are those of the processed distribution (temperature, top-k/top-p applied), like vLLM's
``processed_logprobs``. Pause holds the queue and stops the running batch between two decode
steps (a ``_StepGate`` the generation thread passes after every token); a weight update waits
for that stop, not for the batch to finish, so a request in flight across an update is a partial
rollout: each sample's ``versions`` says which weights sampled each token. When the weights changed
under a running batch, the batch's KV cache is computed again with the new weights before the next
token (as the vllm backend recomputes a request kept across an update), so every token after the
update is sampled by the new weights alone; the tokens before it keep the logprobs of the weights that
sampled them. It leaves out continuous batching and paged KV caches: that is what the vllm backend is for.

Every request carries a deadline: a request whose deadline passed (or whose caller gave up) is
dropped from the queue, and a running batch stops generating a request's rows once its deadline
passes (a stopping criterion checked at every token), so no request holds the model longer than
its deadline. ``update_weights`` hands each sync request to an ``rlx.sync.receiver.SyncHandler``
(in a worker thread) whose consumer copies the tensors into the parameters, and holds the model
lock while a sync is open: a failed request aborts the sync, so the lock is released and the
backend generates again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from rlx.rollout.backends.base import Backend
from rlx.rollout.protocol import PromptResult, Sample, SamplingSpec
from rlx.sync.messages import BucketAck
from rlx.sync.receiver import Consumer, SyncHandler, WeightReceiver

if TYPE_CHECKING:
    from rlx.config.roles import RolloutRole

MAX_BATCH_PROMPTS = 64
GATHER_QUIET_S = 0.005  # a batch starts once no request came in for this long ...
GATHER_MAX_S = 0.03  # ... or this long after its first request: a step's prompts, sent together, share one call
GATHER_TOGETHER_S = 0.1  # the longest a batch waits for the requests its client said it sent at once
NOISE_PER_ROW = 1 << 16  # floats of sampling noise drawn ahead per row (``_RowSampler``)
PROMPT_IDS_KEPT = 4096  # text prompts whose token ids are kept (``HfBackend._token_ids``)


class HfBackend(Backend):
    name = "hf"

    def __init__(self, cfg: RolloutRole) -> None:
        self.cfg = cfg
        self.model_path = cfg.model.path
        self._queue: asyncio.Queue = asyncio.Queue()
        self._running = asyncio.Event()
        self._awake = asyncio.Event()  # cleared while asleep (colocated placement)
        self._awake.set()
        self._asleep: set[str] = set()
        self._running.set()
        self._model_lock = asyncio.Lock()
        self._sync_holds_lock = False
        self._sync_open = False
        self._client_paused = False
        self._gate = _StepGate()
        self._closing = threading.Event()  # set by close: the batch being generated ends at its next step
        self._generating = False  # a batch runs in the generation thread
        self.weight_version = 0  # the version that labels the tokens sampled from here on
        self._batcher: asyncio.Task | None = None
        self._handler = None  # the weight-sync handler, made at the first update
        self._ids_of: dict[str, list[int]] = {}  # text prompt -> its token ids (``_token_ids``)
        self._ids_lock = threading.Lock()

    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        self._batcher = asyncio.create_task(self._batch_loop())

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rlx.placement import device_type, set_cpu_threads

        self.device = device_type(self.cfg.rollout.device)
        set_cpu_threads(self.cfg.rollout.cpu_threads, self.device)
        dtype = getattr(torch, self.cfg.model.engine_dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype).to(self.device).eval()
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        config_eos = self.model.generation_config.eos_token_id
        self.stop_ids = {self.tokenizer.eos_token_id, *(config_eos if isinstance(config_eos, list) else [config_eos])}
        """Tokens that end a sample and are kept in it: the tokenizer's EOS and the generation config's."""
        torch.manual_seed(self.cfg.seed)
        if self.device == "cuda":
            from rlx.placement import apply_memory_budget

            apply_memory_budget(self.cfg.placement.gpu_memory_gb)

    def prompt_len(self, prompt: str | list[int]) -> int:
        return len(prompt) if isinstance(prompt, list) else len(self._token_ids(prompt))

    def _token_ids(self, prompt: str | list[int]) -> list[int]:
        """A text prompt's ids, encoded once: the server asks for its length when the request comes in, the batch
        for its ids (the recent prompts are kept, ``PROMPT_IDS_KEPT``)."""
        if isinstance(prompt, list):
            return prompt
        with self._ids_lock:  # the server's loop and the generation thread both ask
            ids = self._ids_of.get(prompt)
            if ids is None:
                if len(self._ids_of) >= PROMPT_IDS_KEPT:
                    self._ids_of.pop(next(iter(self._ids_of)))
                ids = self._ids_of[prompt] = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return list(ids)

    async def generate(
        self, prompt: str | list[int], sampling: SamplingSpec, deadline: float, together: int = 0
    ) -> PromptResult:
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Item(prompt, sampling, future, time.perf_counter(), deadline, together))
        return await future

    async def _batch_loop(self) -> None:
        pending: list[_Item] = []
        while True:
            await self._running.wait()
            if not pending:
                pending.append(await self._queue.get())
                await self._gather(pending)
            while not self._queue.empty():
                pending.append(self._queue.get_nowait())
            await self._awake.wait()  # a request that came in as it fell asleep waits too
            pending = [item for item in pending if not item.future.done()]  # the caller gave up
            if not pending:
                continue
            spec = pending[0].sampling
            key = _batch_key(spec)
            batch = [item for item in pending if _batch_key(item.sampling) == key][:MAX_BATCH_PROMPTS]
            pending = [item for item in pending if item not in batch]
            async with self._model_lock:
                self._generating = True
                try:
                    results = await asyncio.to_thread(self._generate_batch, batch, spec)
                except Exception as exc:  # fail these requests, keep serving
                    for item in batch:
                        if not item.future.done():
                            item.future.set_exception(exc)
                    continue
                finally:
                    self._generating = False
            now = time.perf_counter()
            for item, result in zip(batch, results, strict=True):
                result.queued_s = max(0.0, now - item.queued_at - result.generate_s)
                if not item.future.done():
                    item.future.set_result(result)

    async def _gather(self, pending: list[_Item]) -> None:
        """Requests sent together (a step's prompts, one request each) arrive a fraction of a millisecond
        apart: the first waits for the rest, so they run as one ``generate`` call instead of the first alone and
        the others after it. Where the client said how many it sent at once (``together``) it waits for that
        many (or a ``GATHER_MAX_S`` pause, up to ``GATHER_TOGETHER_S``): a trainer computing beside the client can
        spread their arrival over more than the quiet gap. Otherwise until none came in for ``GATHER_QUIET_S``, or
        ``GATHER_MAX_S`` passed."""
        start = last = time.perf_counter()
        while len(pending) < MAX_BATCH_PROMPTS:
            now = time.perf_counter()
            expected = min(max(item.together for item in pending), MAX_BATCH_PROMPTS)
            if expected > 1:  # a share counted short (uneven routing over servers) ends on a longer pause
                if len(pending) >= expected or now - last >= GATHER_MAX_S or now - start >= GATHER_TOGETHER_S:
                    return
            elif now - last >= GATHER_QUIET_S or now - start >= GATHER_MAX_S:
                return
            if self._queue.empty():
                await asyncio.sleep(GATHER_QUIET_S / 3)
                continue
            while not self._queue.empty():
                pending.append(self._queue.get_nowait())
            last = time.perf_counter()

    def _generate_batch(self, batch: list[_Item], spec: SamplingSpec) -> list[PromptResult]:
        self._gate.enter()  # a sync or a pause may hold the weights
        try:
            return self._generate_gated(batch, spec)
        finally:
            self._gate.leave()

    def _generate_gated(self, batch: list[_Item], spec: SamplingSpec) -> list[PromptResult]:
        import torch
        from transformers import DynamicCache, LogitsProcessorList, StoppingCriteriaList

        start = time.perf_counter()
        ids = [self._token_ids(item.prompt) for item in batch]
        inputs = self.tokenizer.pad({"input_ids": ids}, return_tensors="pt").to(self.device)
        greedy = spec.temperature == 0
        rows = 1 if greedy else spec.n  # greedy samples are all alike: generate one, hand it out n times
        # sample j of a request draws from its own stream, seeded (request seed + j) as vLLM seeds it, so what a
        # request gets does not depend on which others share its batch; unseeded requests get a seed drawn here
        seeds = [
            (item.sampling.seed if item.sampling.seed is not None else int(torch.randint(2**62, ()))) for item in batch
        ]
        sampler = None if greedy else _RowSampler([seed + j for seed in seeds for j in range(rows)], spec, self.device)
        cache = DynamicCache()
        if rows > 1:  # each prompt's keys and values computed once, then copied to its n rows
            self._prefill(cache, inputs["input_ids"], inputs["attention_mask"], rows)
            inputs = {key: value.repeat_interleave(rows, dim=0) for key, value in inputs.items()}
        prompt_mask = inputs["attention_mask"]  # generate's rows: prompt-major
        recompute = (
            None
            if self.cfg.rollout.kv_after_sync == "keep"
            else lambda input_ids: self._recompute(cache, input_ids, prompt_mask, rows)
        )
        stepper = _VersionedSteps(self._gate, self, recompute)
        row_deadlines = [item.deadline for item in batch for _ in range(rows)]  # rows are prompt-major
        with torch.no_grad():
            out = self.model.generate(  # greedy over the sampler's one-hot rows: it has already drawn each token
                **inputs,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                max_new_tokens=spec.max_tokens,
                stop_strings=list(spec.stop) or None,
                tokenizer=self.tokenizer,
                past_key_values=cache,
                logits_processor=LogitsProcessorList([sampler] if sampler else []),
                stopping_criteria=StoppingCriteriaList([_PastDeadline(row_deadlines, self._closing), stepper]),
                output_scores=sampler is None,
                return_dict_in_generate=True,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        new_tokens = out.sequences[:, inputs["input_ids"].shape[1] :]
        if sampler is not None:
            token_logprobs, drawn = torch.stack(sampler.logprobs, dim=1), torch.stack(sampler.tokens, dim=1)
        else:
            steps = torch.stack(out.scores, dim=1).float().log_softmax(-1)  # [B*n, T, V]
            token_logprobs, drawn = steps.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1), steps.argmax(-1)
        elapsed = time.perf_counter() - start
        samples = self._samples(
            new_tokens.tolist(), token_logprobs.tolist(), stepper.versions, (new_tokens != drawn).tolist()
        )
        if self.cfg.record_routes:
            self._record_routes([list(ids[i // rows]) for i in range(len(samples))], samples)
        return [
            PromptResult(
                prompt_token_ids=list(prompt_ids),
                samples=[samples[i * rows + j % rows] for j in range(spec.n)],
                generate_s=elapsed,
            )
            for i, prompt_ids in enumerate(ids)
        ]

    def _record_routes(self, prompts: list[list[int]], samples: list[Sample]) -> None:
        """Each sample's MoE routes (``Sample.routes``): the experts this model's routers choose for its prompt
        and completion but the last token, in one forward over every sample (right-padded) after generation.
        Decoding's own choices are not kept (its batches are left-padded and cached); this pass computes the same
        tokens with the same weights, up to the rounding of another batch shape."""
        import numpy as np
        import torch

        from rlx.formats.experts import moe_experts, record_routes, route_dtype

        tokens = [(prompt + sample.token_ids)[:-1] for prompt, sample in zip(prompts, samples, strict=True)]
        width = max(len(row) for row in tokens)
        ids = torch.full((len(tokens), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(tokens), width), dtype=torch.long)
        for i, row in enumerate(tokens):
            ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        inputs = dict(input_ids=ids, attention_mask=mask, position_ids=torch.arange(width).expand_as(ids))
        with torch.no_grad():
            recorded = record_routes(
                self.model, lambda: self.model(**{k: v.to(self.device) for k, v in inputs.items()}, logits_to_keep=1)
            )
        routes = torch.stack(recorded, dim=1).view(len(tokens), width, len(recorded), -1)
        dtype = route_dtype(moe_experts(self.model.config)[0])
        for sample, row, held in zip(samples, tokens, routes.to(dtype).cpu().numpy(), strict=True):
            array = np.ascontiguousarray(held[: len(row)])
            sample.routes, sample.routes_shape = array.tobytes(), list(array.shape)
            sample.routes_dtype = array.dtype.str

    def _prefill(self, cache, input_ids, attention_mask, rows: int) -> None:
        """``cache`` holding every prompt token but the last (which generate feeds in its first step) for each
        prompt once, then repeated for its ``rows`` samples: a group's prompt is computed once, not n times."""
        if input_ids.shape[1] < 2:
            return
        self._forward_into(cache, input_ids[:, :-1], attention_mask[:, :-1])
        cache.batch_repeat_interleave(rows)

    def _recompute(self, cache, input_ids, prompt_mask, rows: int) -> None:
        """``cache`` (generate's own) filled again with the current weights, with the positions and mask generate
        uses: each prompt's keys and values once, copied to its ``rows`` samples (as ``_prefill`` made them), then
        every generated position it held. A sync in the middle of a quickstart batch cost 90 ms when each of the
        256 rows went through its whole prompt again."""
        import torch

        held = cache.get_seq_length()  # every position but the newest token's, which the next step feeds
        generated = torch.ones(
            prompt_mask.shape[0], held - prompt_mask.shape[1], dtype=prompt_mask.dtype, device=prompt_mask.device
        )
        mask = torch.cat([prompt_mask, generated], dim=1)  # generate counts every new token, finished rows too
        shared = min(prompt_mask.shape[1] - 1, held) if rows > 1 else 0  # the prompt positions _prefill holds
        if shared > 0:  # one row per prompt (selected while the cache holds positions: an empty one keeps its rows)
            cache.batch_select_indices(torch.arange(0, input_ids.shape[0], rows, device=input_ids.device))
        cache.crop(-held)
        if shared > 0:
            self._forward_into(cache, input_ids[::rows, :shared], mask[::rows, :shared])
            cache.batch_repeat_interleave(rows)
        if held > shared:
            self._forward_into(cache, input_ids[:, shared:held], mask[:, :held])

    def _forward_into(self, cache, input_ids, mask) -> None:
        """One forward over ``input_ids`` that appends their keys and values to ``cache``, with the positions
        generate derives from ``mask`` (which covers the positions ``cache`` holds, then these)."""
        import torch

        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, -input_ids.shape[1] :]
        with torch.no_grad():
            self.model(
                input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
            )

    def _samples(
        self,
        token_rows: list[list[int]],
        logprob_rows: list[list[float]],
        versions: list[int],
        filler_rows: list[list[bool]],
    ) -> list[Sample]:
        """One ``Sample`` per generated row: its tokens up to and with the first stop token (``stop_ids``), or up
        to where generate wrote pad in place of the drawn token (``filler_rows``: the row had finished at a stop
        string or its deadline), decoded together. A pad token the row drew itself is one of its tokens, as vLLM
        keeps it."""
        ends = []
        for tokens, filler in zip(token_rows, filler_rows, strict=True):
            length, finish = len(tokens), "length"
            for pos, (tok, padded) in enumerate(zip(tokens, filler, strict=True)):
                if padded or tok in self.stop_ids:
                    length, finish = pos + (not padded), "stop"
                    break
            ends.append((length, finish))
        kept = [tokens[:length] for tokens, (length, _) in zip(token_rows, ends, strict=True)]
        texts = self.tokenizer.batch_decode(kept, skip_special_tokens=True)
        return [
            Sample(
                token_ids=tokens,
                logprobs=logprobs[:length],
                text=text,
                finish_reason=finish,
                versions=versions[:length],
            )
            for tokens, logprobs, text, (length, finish) in zip(kept, logprob_rows, texts, ends, strict=True)
        ]

    async def sleep(self, level: int) -> list[str]:
        """The queue is held and, once the running batch is done, the model moves to CPU at either level: it
        keeps no KV cache between batches, and the sync copies into its parameters wherever they are."""
        self._awake.clear()
        async with self._model_lock:
            await asyncio.to_thread(self._move_model, "cpu")
        self._asleep = {"weights", "kv_cache"}
        return sorted(self._asleep)

    async def wake_up(self, tags: list[str]) -> list[str]:
        tags = set(tags) or {"weights", "kv_cache"}
        if "weights" in tags & self._asleep:
            async with self._model_lock:
                await asyncio.to_thread(self._move_model, self.device)
        self._asleep -= tags
        if not self._asleep:
            self._awake.set()
        return sorted(self._asleep)

    def _move_model(self, device: str) -> None:
        import torch

        if self.device == "cuda":  # on a CPU-only host there is nothing to free
            self.model.to(device)
            torch.cuda.empty_cache()

    async def memory_gb(self) -> tuple[float, float]:
        import torch

        if self.device != "cuda":
            return 0.0, 0.0
        now, peak = torch.cuda.memory_reserved() / 2**30, torch.cuda.max_memory_reserved() / 2**30
        torch.cuda.reset_peak_memory_stats()
        return now, peak

    async def score(self, token_ids: list[list[int]], start: list[int]) -> list[list[float]]:
        async with self._model_lock:
            return await asyncio.to_thread(self._score_batch, token_ids, start)

    def _score_batch(self, token_ids: list[list[int]], start: list[int]) -> list[list[float]]:
        """Right-padded batches of ``MAX_BATCH_PROMPTS`` sequences; float32 log-softmax of the logits."""
        import torch

        out = []
        for b in range(0, len(token_ids), MAX_BATCH_PROMPTS):
            rows = token_ids[b : b + MAX_BATCH_PROMPTS]
            width = max(len(ids) for ids in rows)
            ids = torch.tensor([r + [self.tokenizer.pad_token_id] * (width - len(r)) for r in rows], device=self.device)
            attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=self.device)
            with torch.no_grad():
                logits = self.model(input_ids=ids, attention_mask=attention).logits.float()
            logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            out += [
                logp[i, s - 1 : len(r) - 1].tolist()
                for i, (r, s) in enumerate(zip(rows, start[b : b + len(rows)], strict=True))
            ]
        return out

    async def pause(self) -> None:
        self._client_paused = True
        self._running.clear()
        self._gate.close()

    async def resume(self) -> None:
        self._client_paused = False
        self._running.set()
        if not self._sync_open:
            self._gate.open()

    async def update_weights(self, payload: bytes) -> BucketAck:
        if self._handler is None:
            lora = self.cfg.model.lora
            if lora.rank:  # an adapter sync merges into the weights (rlx.rollout.backends.lora says why)
                from rlx.rollout.backends.lora import AdapterMerger

                loader = AdapterMerger(self.model, lora.alpha / lora.rank)
            else:
                loader = _ModelLoader(self.model)
            self._handler = SyncHandler(WeightReceiver("hf backend", assemble_into=loader.destination), loader)
        if not self._sync_open:
            await self._hold_model()
        ack = None
        try:
            # in a thread: a gloo / nccl begin waits for its group's rendezvous, a bucket copies
            ack = await asyncio.to_thread(self._handler.handle, payload)
        finally:
            if ack is not None and ack.completed:
                self.weight_version += 1  # the server counts the same way; a Resume may name it instead
            if ack is None or not ack.in_sync:
                self._release_model()
        return ack

    async def _hold_model(self) -> None:
        """No generation step from here until ``_release_model``: a running batch stops between two
        decode steps (and goes on after the sync), an idle model is locked."""
        self._sync_open = True
        self._gate.close()
        while True:
            if not self._model_lock.locked():
                await self._model_lock.acquire()
                self._sync_holds_lock = True
                return
            if self._generating and self._gate.parked():
                return
            await asyncio.sleep(0.001)

    def _release_model(self) -> None:
        self._sync_open = False
        if self._sync_holds_lock:
            self._sync_holds_lock = False
            self._model_lock.release()
        if not self._client_paused:
            self._gate.open()

    def failure(self) -> str:
        if self._batcher is not None and self._batcher.done() and not self._batcher.cancelled():
            return f"the hf generation loop stopped: {self._batcher.exception()!r}"
        return ""

    async def close(self) -> None:
        self._closing.set()  # the batch in the generation thread stops at its next step: the process can exit
        self._gate.open()  # a generation thread waiting between two steps must not outlive the server
        if self._batcher is not None:
            self._batcher.cancel()


class _ModelLoader(Consumer):
    """The handler's consumer: copies each tensor into the parameter (or buffer) of its name."""

    def __init__(self, model) -> None:
        from rlx.formats.experts import expert_views

        params = dict(model.named_parameters())
        self.targets = {**dict(model.named_buffers()), **params, **expert_views(params)}

    def destination(self, name: str, dtype, shape: list[int], device):
        """The parameter (or buffer) ``name`` when it takes the sender's bytes as they are, so the
        receiver assembles split tensors, and a gloo / nccl broadcast lands, straight in it."""
        tensor = self.targets.get(name)
        if (
            tensor is None
            or tensor.dtype != dtype
            or list(tensor.shape) != shape
            or tensor.device != device
            or not tensor.is_contiguous()
        ):
            return None
        return tensor.detach()

    def load(self, tensors, verify: bool) -> None:
        import torch

        with torch.no_grad():
            for name, tensor in tensors:
                if name not in self.targets:
                    raise KeyError(f"the model has no parameter {name!r}")
                target = self.targets[name]
                if tensor.data_ptr() != target.data_ptr() or tensor.numel() == 0:  # else: already in place
                    target.copy_(tensor.view(target.shape))


class _Item(NamedTuple):
    prompt: str | list[int]
    sampling: SamplingSpec
    future: asyncio.Future
    queued_at: float
    deadline: float  # time.time() after which nobody waits for the result
    together: int = 0  # prompts sent at once with this one (``Generate.together``)


class _RowSampler:
    """A transformers logits processor that samples every row from its own random stream: the scores are warped
    as the request asks (temperature, top-k, top-p), one token is drawn per row by the Gumbel-max trick with that
    row's generator, and the row comes back one-hot (0 on the token, -inf elsewhere) for greedy decoding to
    take. ``logprobs`` holds each step's logprobs of the drawn tokens under the warped distribution (vLLM's
    ``processed_logprobs``), ``tokens`` the drawn tokens."""

    def __init__(self, seeds: list[int], spec: SamplingSpec, device) -> None:
        import torch
        from transformers import (
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.warpers = LogitsProcessorList()
        if spec.temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(spec.temperature))
        if spec.top_k > 0:
            self.warpers.append(TopKLogitsWarper(spec.top_k))
        if spec.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(spec.top_p))
        self.generators = [torch.Generator(device=device).manual_seed(seed % 2**64) for seed in seeds]
        self.max_tokens = spec.max_tokens
        self.logprobs: list = []
        self.tokens: list = []
        """Each step's drawn token per row: where generate's output differs, the row had finished and got pad."""
        self._gumbel = None  # [rows, steps, vocab]: the noise of the next steps, drawn together
        self._step = 0

    def __call__(self, input_ids, scores):
        import torch

        logp = self.warpers(input_ids, scores).float().log_softmax(-1)
        if self._gumbel is None or self._step == self._gumbel.shape[1]:
            self._gumbel, self._step = self._draw(scores.shape[-1], scores.device), 0
        gumbel = self._gumbel[:, self._step]
        self._step += 1
        token = (logp + gumbel).argmax(dim=-1, keepdim=True)  # a draw from softmax(logp)
        self.logprobs.append(logp.gather(-1, token).squeeze(-1))
        self.tokens.append(token.squeeze(-1))
        return torch.full_like(scores, float("-inf")).scatter_(-1, token, 0.0)

    def _draw(self, vocab: int, device):
        """Gumbel noise for the next steps of every row, from each row's own generator: as many steps as
        ``NOISE_PER_ROW`` floats hold (every step of a small vocabulary at once, one step of a large one). The
        count depends on the vocabulary alone, never on the batch, and a CPU generator's stream is the same
        drawn in one call or in several, so the tokens are those of one draw per step."""
        import torch

        steps = max(1, min(self.max_tokens, NOISE_PER_ROW // vocab))
        uniform = torch.stack([torch.rand(steps, vocab, generator=g, device=device) for g in self.generators])
        return -torch.log(-torch.log(uniform.clamp(min=1e-20)))


class _PastDeadline:
    """A transformers stopping criterion: a row is done once its request's deadline has passed, and every row
    once the backend is closing."""

    def __init__(self, row_deadlines: list[float], closing: threading.Event) -> None:
        self.row_deadlines = row_deadlines
        self.closing = closing

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        now = float("inf") if self.closing.is_set() else time.time()
        return torch.tensor([now >= d for d in self.row_deadlines], dtype=torch.bool, device=input_ids.device)


class _StepGate:
    """Where the generation thread may be stopped: it ``enter``s before a decode step and ``leave``s
    after it; while the gate is closed ``enter`` waits, so ``parked`` (closed, no step running) means
    the weights can change under a batch in flight."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open = True
        self._stepping = False

    def open(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._open = False

    def parked(self) -> bool:
        with self._cond:
            return not self._open and not self._stepping

    def enter(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._open)
            self._stepping = True

    def leave(self) -> None:
        with self._cond:
            self._stepping = False


class _VersionedSteps:
    """A stopping criterion that never stops: called after each decode step, it records the weight version
    that produced the step's token and lets a pause or a weight update in through the gate; when the weights
    changed meanwhile, ``recompute`` (None with ``rollout.kv_after_sync=keep``) rebuilds the KV cache with them
    before the next step."""

    def __init__(self, gate: _StepGate, backend: HfBackend, recompute) -> None:
        self.gate, self.backend, self.recompute = gate, backend, recompute
        self.version = backend.weight_version
        self.versions: list[int] = []

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        self.versions.append(self.version)
        self.gate.leave()
        self.gate.enter()
        if self.backend.weight_version != self.version and self.recompute is not None:
            self.recompute(input_ids)
        self.version = self.backend.weight_version
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _batch_key(spec: SamplingSpec) -> SamplingSpec:
    """Requests that differ only in their seed share one ``generate`` call: each sample draws from its own
    stream (``_RowSampler``), so a step's prompts (each with its own seed) run as one batch instead of one call
    each and still get what each would get alone."""
    return msgspec.structs.replace(spec, seed=None)
