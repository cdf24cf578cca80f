"""`rlx fp8-convert SRC DST`: Hugging Face checkpoint -> FP8 checkpoint that vLLM loads."""

from __future__ import annotations

from pathlib import Path

import typer

from rlx.cli.common import console, err_console
from rlx.cli.convert_ckpt import convert_errors


def fp8_convert(
    src: Path = typer.Argument(..., help="Hugging Face model directory (bf16 / fp16 / fp32 safetensors)."),
    dst: Path = typer.Argument(..., help="Output directory (must not exist unless --overwrite)."),
    strategy: str = typer.Option(
        "block",
        "--strategy",
        metavar="<block|channel|tensor>",
        help="block (weight_scale_inv per block) | channel | tensor (compressed-tensors weight_scale).",
    ),
    block_size: tuple[int, int] = typer.Option((128, 128), "--block-size", help="Block rows and columns (N K)."),
    skip: list[str] | None = typer.Option(
        None, "--skip", help="Keep tensors / modules matching this glob in high precision (repeatable)."
    ),
    tp: int = typer.Option(
        1,
        "--tp",
        help="Tensor-parallel size vLLM will use; every quantized layer's per-rank part must be whole blocks.",
    ),
    workers: int = typer.Option(
        0, "--workers", help="Threads that read, quantize and write at once (0: one per CPU core, plus one)."
    ),
    report: Path | None = typer.Option(None, "--report", help="Also write the report as JSON here."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and exit."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace DST if it exists."),
) -> None:
    """Quantize a checkpoint's linear weights to float8_e4m3fn, streaming, with an error report."""
    with convert_errors():
        from rlx.convert.destination import check_destination
        from rlx.convert.fp8.job import Fp8Options, fp8_job
        from rlx.convert.fp8.parallel import default_workers

        options = Fp8Options(strategy, tuple(block_size), list(skip or []), tp, workers or default_workers())
        job = fp8_job(src, options)
        destination = check_destination(dst, src, overwrite)
        if dry_run:
            from rlx.convert.plan import render_plan

            render_plan(job.plan(destination), console)
            return
        result = job.run(destination, err_console)
    from rlx.convert.fp8.report import render_report

    render_report(result, console)
    if report:
        result.write_json(report)
        console.print(f"report: {report}", highlight=False)
