"""transformers backend: batched ``generate`` for machines without vLLM (e.g. a torch-only GPU box).

Requests queue up; a batcher takes up to ``MAX_BATCH_PROMPTS`` prompts with the same sampling
parameters, left-pads them and runs one ``generate`` call in a worker thread. Logprobs are
those of the processed distribution (temperature, top-k/top-p applied), like vLLM's
``processed_logprobs``. Pause lets the running batch finish and holds the queue. It leaves
out continuous batching and paged KV caches: that is what the vllm backend is for.

Every request carries a deadline: a request whose deadline passed (or whose caller gave up) is
dropped from the queue, and a running batch stops generating a request's rows once its deadline
passes (a stopping criterion checked at every token), so no request holds the model longer than
its deadline. A weight update holds the model lock from ``update_begin`` to ``update_end`` or
``update_abort``; each of them, failing or not, leaves the backend able to generate.
"""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

from rlx.rollout.backends.base import Backend
from rlx.rollout.protocol import PromptResult, Sample, SamplingSpec
from rlx.sync.messages import BucketAck, SyncBegin, SyncBucket, SyncEnd

MAX_BATCH_PROMPTS = 64


class HfBackend(Backend):
    name = "hf"

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.model_path = cfg.model.path
        self._queue: asyncio.Queue = asyncio.Queue()
        self._running = asyncio.Event()
        self._running.set()
        self._model_lock = asyncio.Lock()
        self._sync_holds_lock = False
        self._batcher: asyncio.Task | None = None
        self._receiver = None
        self._targets = None  # name -> parameter or buffer, for receiving in place

    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        self._batcher = asyncio.create_task(self._batch_loop())

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        want = self.cfg.rollout.device
        self.device = "cuda" if want == "cuda" or (want == "auto" and torch.cuda.is_available()) else "cpu"
        dtype = getattr(torch, self.cfg.model.engine_dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype).to(self.device).eval()
        torch.manual_seed(self.cfg.trainer.seed)

    def prompt_len(self, prompt: str | list[int]) -> int:
        return len(prompt) if isinstance(prompt, list) else len(self._token_ids(prompt))

    def _token_ids(self, prompt: str | list[int]) -> list[int]:
        return prompt if isinstance(prompt, list) else self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    async def generate(self, prompt: str | list[int], sampling: SamplingSpec, deadline: float) -> PromptResult:
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Item(prompt, sampling, future, time.perf_counter(), deadline))
        return await future

    async def _batch_loop(self) -> None:
        pending: list[_Item] = []
        while True:
            await self._running.wait()
            if not pending:
                pending.append(await self._queue.get())
            while not self._queue.empty():
                pending.append(self._queue.get_nowait())
            pending = [item for item in pending if not item.future.done()]  # the caller gave up
            if not pending:
                continue
            spec = pending[0].sampling
            batch = [item for item in pending if item.sampling == spec][:MAX_BATCH_PROMPTS]
            pending = [item for item in pending if item not in batch]
            async with self._model_lock:
                try:
                    results = await asyncio.to_thread(self._generate_batch, batch, spec)
                except Exception as exc:  # fail these requests, keep serving
                    for item in batch:
                        if not item.future.done():
                            item.future.set_exception(exc)
                    continue
            now = time.perf_counter()
            for item, result in zip(batch, results):
                result.queued_s = max(0.0, now - item.queued_at - result.generate_s)
                if not item.future.done():
                    item.future.set_result(result)

    def _generate_batch(self, batch: list[_Item], spec: SamplingSpec) -> list[PromptResult]:
        import torch
        from transformers import StoppingCriteriaList

        start = time.perf_counter()
        ids = [self._token_ids(item.prompt) for item in batch]
        inputs = self.tokenizer.pad({"input_ids": ids}, return_tensors="pt").to(self.device)
        if spec.seed is not None:
            torch.manual_seed(spec.seed)
        greedy = spec.temperature == 0
        rows = 1 if greedy else spec.n  # greedy samples are all alike: generate one, hand it out n times
        row_deadlines = [item.deadline for item in batch for _ in range(rows)]  # rows are prompt-major
        with torch.no_grad():
            out = self.model.generate(
                **inputs, do_sample=not greedy, temperature=spec.temperature or None,
                top_p=spec.top_p, top_k=spec.top_k if spec.top_k > 0 else None, max_new_tokens=spec.max_tokens,
                num_return_sequences=rows, stop_strings=list(spec.stop) or None, tokenizer=self.tokenizer,
                stopping_criteria=StoppingCriteriaList([_PastDeadline(row_deadlines)]),
                output_scores=True, return_dict_in_generate=True, pad_token_id=self.tokenizer.pad_token_id)
        new_tokens = out.sequences[:, inputs["input_ids"].shape[1]:]
        steps = torch.stack(out.scores, dim=1).float().log_softmax(-1)  # [B*n, T, V]
        token_logprobs = steps.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        elapsed = time.perf_counter() - start
        results = []
        for i, prompt_ids in enumerate(ids):
            samples = [self._sample(new_tokens[i * rows + j % rows], token_logprobs[i * rows + j % rows], spec)
                       for j in range(spec.n)]
            results.append(PromptResult(prompt_token_ids=list(prompt_ids), samples=samples, generate_s=elapsed))
        return results

    def _sample(self, tokens, logprobs, spec: SamplingSpec) -> Sample:
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        token_list = tokens.tolist()
        length, finish = len(token_list), "length"
        for pos, tok in enumerate(token_list):
            if tok == eos:
                length, finish = pos + 1, "stop"
                break
            if tok == pad:
                length, finish = pos, "stop"
                break
        kept = token_list[:length]
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        return Sample(token_ids=kept, logprobs=[float(x) for x in logprobs[:length]], text=text, finish_reason=finish)

    async def pause(self) -> None:
        self._running.clear()

    async def resume(self) -> None:
        self._running.set()

    async def update_begin(self, req: SyncBegin) -> None:
        from rlx.sync.receiver import WeightReceiver

        if not self._sync_holds_lock:
            await self._model_lock.acquire()  # no generate until update_end / update_abort
            self._sync_holds_lock = True
        try:
            self._receiver = self._receiver or WeightReceiver(assemble_into=self._parameter_for)
            # in a thread: a gloo / nccl begin waits for its group's rendezvous
            await asyncio.to_thread(self._receiver.begin, req)
        except BaseException:
            await self.update_abort()
            raise

    def _parameter_for(self, name: str, dtype, shape: list[int], device):
        """The parameter (or buffer) ``name`` when it takes the sender's bytes as they are, so the
        receiver assembles split tensors, and a gloo / nccl broadcast lands, straight in it."""
        if self._targets is None:
            self._targets = {**dict(self.model.named_buffers()), **dict(self.model.named_parameters())}
        tensor = self._targets.get(name)
        if (tensor is None or tensor.dtype != dtype or list(tensor.shape) != shape or tensor.device != device
                or not tensor.is_contiguous()):
            return None
        return tensor.detach()

    async def update_bucket(self, req: SyncBucket) -> BucketAck:
        return await asyncio.to_thread(self._load_bucket, req)

    def _load_bucket(self, req: SyncBucket) -> BucketAck:
        import torch

        meta = req.meta
        try:
            named = dict(self.model.named_parameters())
            named.update(self.model.named_buffers())
            tensors = self._receiver.tensors(meta)
            with torch.no_grad():
                for name, tensor in tensors:
                    if name not in named:
                        raise KeyError(f"the model has no parameter {name!r}")
                    if tensor.data_ptr() != named[name].data_ptr() or tensor.numel() == 0:  # else: already in place
                        named[name].copy_(tensor.view(named[name].shape))
            del tensors
            return self._receiver.ack(meta)
        except Exception as exc:
            return BucketAck(sync_id=meta.sync_id, bucket_id=meta.bucket_id, ok=False,
                             error=f"{type(exc).__name__}: {exc}")

    async def update_end(self, req: SyncEnd) -> BucketAck:
        try:
            return self._receiver.end(req)
        finally:
            self._release_model()

    async def update_abort(self) -> None:
        """Forget the sync in progress (its sender failed or vanished) and let generation run again;
        the weights are then a mix of old and new until the next sync completes."""
        receiver, self._receiver = self._receiver, None
        try:
            if receiver is not None:
                receiver.close()
        finally:
            self._release_model()

    def _release_model(self) -> None:
        if self._sync_holds_lock:
            self._sync_holds_lock = False
            self._model_lock.release()

    def failure(self) -> str:
        if self._batcher is not None and self._batcher.done() and not self._batcher.cancelled():
            return f"the hf generation loop stopped: {self._batcher.exception()!r}"
        return ""

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()


class _Item(NamedTuple):
    prompt: str | list[int]
    sampling: SamplingSpec
    future: asyncio.Future
    queued_at: float
    deadline: float  # time.time() after which nobody waits for the result


class _PastDeadline:
    """A transformers stopping criterion: a row is done once its request's deadline has passed."""

    def __init__(self, row_deadlines: list[float]) -> None:
        self.row_deadlines = row_deadlines

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        now = time.time()
        return torch.tensor([now >= d for d in self.row_deadlines], dtype=torch.bool, device=input_ids.device)
