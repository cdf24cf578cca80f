"""`rlx bench-sync`: benchmark trainer -> rollout weight transfer against the copy ceiling.

Heavy imports (torch, the sync package) happen inside the command; the measurements live in
``rlx.bench.sync``, this module only parses flags, prints the table and writes the JSON.
"""

from __future__ import annotations

from pathlib import Path

import typer

from rlx.cli.common import UserError, console, err_console, user_errors

_PRESETS = ["0.5b", "1.5b", "7b"]


def bench_sync(
    preset: list[str] | None = typer.Option(
        None,
        "--preset",
        metavar="<0.5b|1.5b|7b>",
        help="Synthetic Qwen2-shaped model (repeatable); default 0.5b with a CPU transport, all three with cuda_ipc "
        "or nccl.",
    ),
    model: Path | None = typer.Option(
        None, "--model", help="A Hugging Face model directory to send instead of presets."
    ),
    transport: list[str] = typer.Option(
        ["shm"],
        "--transport",
        metavar="<shm|cuda_ipc|gloo|nccl>",
        help="shm (CPU), cuda_ipc (GPU), gloo (broadcast, CPU) or nccl (broadcast, GPU) (repeatable).",
    ),
    bucket_mb: list[int] | None = typer.Option(
        None,
        "--bucket-mb",
        help="Bucket (slot) size in MiB (repeatable); default 32, 64, 128 for shm, 64, 256, 1024 for cuda_ipc, 16, 64 "
        "for gloo, 64, 256 for nccl.",
    ),
    repeats: int = typer.Option(
        3, "--repeats", help="Timed runs per measurement, after one warm-up; the median is shown."
    ),
    dtype: str = typer.Option(
        "bfloat16", "--dtype", metavar="<bfloat16|float16|float32>", help="dtype of synthetic weights."
    ),
    verify: bool = typer.Option(
        False, "--verify", help="One more sync per sender with per-tensor checksums; exit 1 on a mismatch."
    ),
    json_path: Path | None = typer.Option(None, "--json", help="Write all results (every timing) to this JSON file."),
    target: str = typer.Option(
        "process",
        "--target",
        metavar="<process|server>",
        help="Where the receivers run: process (a local receiver process) or server (a rollout server: vLLM "
        "load_weights included; needs --model or --server).",
    ),
    server: str | None = typer.Option(
        None, "--server", help="--target server: address of a running rollout server (default: start one on --model)."
    ),
    memory_gb: float | None = typer.Option(
        None,
        "--memory-gb",
        help="Memory budget in GB (default: 45% of what is free); presets that do not fit lose layers.",
    ),
    timeout_s: float = typer.Option(120.0, "--timeout-s", help="Deadline for each acknowledgement, in seconds."),
    assemble_in_place: bool = typer.Option(
        True,
        "--assemble-in-place/--no-assemble-in-place",
        help="The receiver assembles split tensors straight into its destination (one copy fewer).",
    ),
    lora_rank: int = typer.Option(
        0,
        "--lora-rank",
        help="Also compare LoRA sync of rank R: adapter-only (model.lora.sync=adapter) against merged, same model and "
        "sender.",
    ),
    receiver_gpu: int | None = typer.Option(
        None,
        "--receiver-gpu",
        help="GPU of the receiver (the sender uses GPU 0); default 1 for nccl, 0 for cuda_ipc (another GPU: "
        "peer-to-peer).",
    ),
) -> None:
    """Measure weight transfer (trainer -> receiver process) against a one-thread copy and a lock-step baseline."""
    import asyncio
    import math

    import msgspec

    from rlx.bench.sync import GPU_TRANSPORTS, BenchOptions, run_bench

    # the three presets move 1 + 3 + 15 GB per sync: on a CPU host the bare command measures the smallest
    preset = preset or (_PRESETS if any(t in GPU_TRANSPORTS for t in transport) else _PRESETS[:1])

    opts = BenchOptions(
        presets=list(preset),
        model=str(model) if model else None,
        transports=list(transport),
        bucket_mb=list(bucket_mb) if bucket_mb else None,
        repeats=repeats,
        dtype=dtype,
        verify=verify,
        target=target,
        memory_gb=memory_gb,
        timeout_s=timeout_s,
        assemble_in_place=assemble_in_place,
        server=server,
        lora_rank=lora_rank,
        receiver_gpu=receiver_gpu,
    )
    with user_errors():
        if server is not None and not server.startswith(("tcp://", "ipc://")):
            raise UserError(
                f"--server {server!r} must start with tcp:// or ipc:// (the address rlx rollout-serve "
                "printed when it started)"
            )
        if memory_gb is not None and not (math.isfinite(memory_gb) and memory_gb > 0):
            raise UserError(
                f"--memory-gb {memory_gb} must be a positive number of GB (or left out: 45% of what is free)"
            )
        if model is not None and not model.is_dir():
            raise UserError(f"--model {model} is not a directory; pass a Hugging Face model directory")
        try:
            with console.status("measuring..."):
                result = asyncio.run(_run_cancellable(run_bench(opts, _print_row)))
        except ValueError as exc:
            raise UserError(str(exc)) from None
        except asyncio.CancelledError:
            err_console.print("[bold red]stopped by SIGTERM[/]; buffers freed and the receiver ended")
            raise typer.Exit(143) from None
    console.print(_table(result))
    for line in _footer(opts, result):
        console.print(line, highlight=False)
    if json_path:
        json_path.write_bytes(
            msgspec.json.format(
                msgspec.json.encode(
                    {
                        "options": opts,
                        "environment": result.environment,
                        "notes": result.notes,
                        "failures": result.failures,
                        # ok: the row was measured and, where checked, its checksums matched
                        "rows": [dict(msgspec.structs.asdict(r), ok=r.verified is not False) for r in result.rows],
                    }
                )
            )
        )
        console.print(f"results written to {json_path}")
    if result.failures:
        for failure in result.failures:
            err_console.print(f"[bold red]verification failed:[/] {failure}", highlight=False)
        raise typer.Exit(1)


async def _run_cancellable(coro):
    """Run ``coro`` so that SIGTERM cancels it: every ``finally`` runs, so senders free their
    shared memory and the receiver process is stopped (a plain SIGTERM would leave both)."""
    import asyncio
    import signal

    task = asyncio.ensure_future(coro)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)


def _print_row(row) -> None:
    """One line per row as it is measured (rich flushes each print, so a pipe gets it now); the table at the end
    adds the ratios to the ceiling, which needs every round."""
    bucket = f" {row.bucket_mb} MiB" if row.bucket_mb else ""
    console.print(
        f"measured {row.model} {row.transport} {row.mode}{bucket}: {row.seconds * 1e3:.0f} ms, {row.gb_per_s:.2f} GB/s",
        highlight=False,
        soft_wrap=True,
    )


def _table(result):
    from rich import box
    from rich.table import Table

    table = Table(title="weight sync", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("model", "via", "mode", "MiB", "GB", "ms", "GB/s", "x ceil", "x lock", "ok"):
        table.add_column(name, justify="left" if name in ("model", "via", "mode") else "right", no_wrap=True)
    for r in result.rows:
        table.add_row(
            r.model,
            r.transport,
            r.mode,
            str(r.bucket_mb or "-"),
            f"{r.bytes / 1e9:.2f}",
            f"{r.seconds * 1e3:.0f}",
            f"{r.gb_per_s:.2f}",
            f"{r.vs_ceiling:.2f}",
            "-" if r.vs_lockstep is None else f"{r.vs_lockstep:.2f}",
            {None: "-", True: "yes", False: "[red]NO[/]"}[r.verified],
        )
    return table


def _lora_lines(rank: int, rows) -> list[str]:
    lines = [
        (
            f"merged r{rank} / adapter r{rank}: LoRA factors of rank {rank} (float32, the trainer's dtype) on "
            "every q/k/v/o/gate/up/down weight; merged = each adapted weight merged as it is sent (the trainer's "
            "model.lora.sync=merged), adapter = the factors alone (model.lora.sync=adapter), alternating rounds, "
            "one double-buffered sender; the receiver's merge or LoRA load is not in the time."
        )
    ]
    pairs = {}
    for r in rows:
        if r.mode in (f"merged r{rank}", f"adapter r{rank}"):
            pairs.setdefault((r.model, r.transport), {})[r.mode.split()[0]] = r
    for (model, transport), pair in pairs.items():
        merged, adapter = pair["merged"], pair["adapter"]
        lines.append(
            f"{model} {transport}: adapter-only moves {adapter.bytes / 1e6:.1f} MB instead of "
            f"{merged.bytes / 1e6:.0f} MB ({merged.bytes / adapter.bytes:.0f}x fewer bytes) in "
            f"{adapter.seconds * 1e3:.1f} ms instead of {merged.seconds * 1e3:.0f} ms "
            f"({merged.seconds / adapter.seconds:.0f}x faster)"
        )
    return lines


def _footer(opts, result) -> list[str]:
    lines = [
        f"median of {opts.repeats} timed runs after one warm-up (ceiling: of all rounds, which alternate with "
        "the transfers'); torch pinned to 1 thread in the bench and "
        "the receiver process, so every copy uses one core. ceiling = one-thread copy of the same tensors "
        "(memmove, the copy the transfers use on the CPU; device-to-device for cuda_ipc); lock-step = one slot (fill, "
        "send, wait for the ack); double = two slots; zero-copy = the tensors live in a weight arena (shared memory; "
        "one CUDA IPC allocation on a GPU), as a one-rank trainer's weights do, and only their offsets are sent, so "
        "the receiver's copy is the only one. x ceil / x lock = throughput over the "
        "ceiling's / the lock-step sender's at the same bucket size; ok = checksums matched (--verify). gloo / nccl: "
        "the ceiling is a plain torch.distributed broadcast of the same tensors between the same two processes (group "
        "set-up excluded; each transfer sets up its own group), and there is no zero-copy row (the broadcast sends "
        "each tensor from where it is)."
    ]
    if opts.assemble_in_place:
        lines.append(
            "split tensors are assembled straight into the receiver's destinations "
            "(--no-assemble-in-place measures the extra copy a consumer without one pays)."
        )
    if opts.lora_rank:
        lines += _lora_lines(opts.lora_rank, result.rows)
    if opts.verify and not result.failures:
        lines.append("verify: every sender did one more sync with per-tensor checksums; all matched.")
    return lines + [f"note: {note}" for note in result.notes]
