"""`rlx convert-ckpt SRC DST`: trainer checkpoint -> Hugging Face (or, from a LoRA run, a PEFT adapter),
Hugging Face <-> Megatron torch_dist, GGUF file -> Hugging Face. A Hugging Face source (SRC, or --hf-config) may
be a Hub id, ORG/NAME[@REVISION], read from the snapshot of huggingface_hub's cache (``rlx.formats.hub``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import typer

from rlx.cli.common import UserError, console, err_console, user_errors


@contextlib.contextmanager
def convert_errors() -> Iterator[None]:
    """ConvertError (bad input, named with its fix) -> one red line and exit status 2."""
    from rlx.convert.errors import ConvertError

    with user_errors():
        try:
            yield
        except ConvertError as exc:
            raise UserError(str(exc)) from None


def convert_ckpt(
    src: Path = typer.Argument(
        ...,
        help="Trainer checkpoint (step dir, checkpoints/ or run dir), Hugging "
        "Face directory or Hub id (ORG/NAME[@REVISION]), Megatron torch_dist checkpoint, or GGUF file.",
    ),
    dst: Path = typer.Argument(..., help="Output directory (must not exist unless --overwrite)."),
    to: str | None = typer.Option(
        None,
        "--to",
        metavar="<hf|torch_dist|peft>",
        help="Target format. Default: hf; peft for a LoRA trainer checkpoint; required from a Hugging Face source.",
    ),
    dtype: str = typer.Option(
        "auto",
        "--dtype",
        metavar="<auto|float32|bfloat16|float16>",
        help="Output dtype of floating tensors (auto: keep).",
    ),
    shard_size: str = typer.Option("5GB", "--shard-size", help="Largest safetensors shard (e.g. 5GB, 500MB)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (tensors, bytes, mapping) and exit."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace DST if it exists."),
    hf_config: Path | None = typer.Option(
        None,
        "--hf-config",
        help="torch_dist -> hf: HF directory (or Hub id) with config + tokenizer (default: SRC/hf/).",
    ),
    iteration: int | None = typer.Option(
        None, "--iteration", help="torch_dist: iteration to read (default: latest) or to write (default: 0)."
    ),
    vocab_multiple: int = typer.Option(
        128,
        "--vocab-multiple",
        help="-> torch_dist: pad the vocabulary to a multiple of this (Megatron's make-vocab-size-divisible-by x TP).",
    ),
    workers: int = typer.Option(
        0, "--workers", help="Threads that write shards at once (0: one per CPU core, plus one, as fp8-convert)."
    ),
) -> None:
    """Convert a checkpoint between rlx trainer, Hugging Face, Megatron torch_dist and PEFT adapter formats, or
    import a GGUF file as a Hugging Face directory."""
    with convert_errors():
        from rlx.convert.convert_ckpt import ConvertOptions, build_job
        from rlx.convert.destination import check_destination
        from rlx.convert.fp8.parallel import default_workers
        from rlx.convert.units import parse_size

        src, hf_config = _from_hub(src, "SRC"), _from_hub(hf_config, "--hf-config")
        options = ConvertOptions(
            to, dtype, parse_size(shard_size), workers or default_workers(), hf_config, iteration, vocab_multiple
        )
        job = build_job(src, options)
        destination = check_destination(dst, src, overwrite)
        if dry_run:
            from rlx.convert.plan import render_plan

            render_plan(job.plan(destination), console)
            return
        summary = _run(job, destination)
    _print_summary(summary)


def _from_hub(path: Path | None, key: str) -> Path | None:
    """``path``, or the snapshot directory of the Hub id it names (downloaded where the cache lacks it)."""
    from rlx.formats.hub import resolve

    snap = resolve(str(path), key) if path is not None else None
    if snap is None:
        return path
    err_console.print(f"[yellow]note:[/] {key} {path}: Hub snapshot {snap.path} (commit {snap.commit})", soft_wrap=True)
    return Path(snap.path)


def _run(job, destination: Path):
    for note in job.notes:
        err_console.print(f"[yellow]note:[/] {note}", highlight=False)
    return job.run(destination, err_console)


def _print_summary(summary) -> None:
    from rlx.convert.units import format_bytes

    rate = summary.bytes_in / summary.seconds / 1e9 if summary.seconds else 0.0
    console.print(
        f"[green]wrote[/] {summary.destination} ({len(summary.files)} entries: "
        f"{', '.join(summary.files[:6])}{', …' if len(summary.files) > 6 else ''}); read "
        f"{format_bytes(summary.bytes_in)}, wrote {format_bytes(summary.bytes_out)} in "
        f"{summary.seconds:.1f} s ({rate:.2f} GB/s)",
        highlight=False,
    )
