"""`rlx eval CONFIG --model DIR_OR_RUN`: a checkpoint's held-out (or benchmark) evaluation on the run's engine.

The work is ``rlx.launch.evaluation`` (servers, metrics, report) and ``rlx.orchestrator.evaluate`` (the metrics
`rlx train` logs too); this module parses the command, prints the table and writes the JSON.
"""

from __future__ import annotations

from pathlib import Path

import typer

from rlx.cli.common import console, err_console, user_errors


def eval_cmd(
    config: str = typer.Argument(..., help="YAML run config (the run's own: RUN_DIR/config.yaml, or the one it ran)."),
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides, e.g. task.eval_path=bench.jsonl task.num_eval=500."
    ),
    model: str = typer.Option(
        ...,
        "--model",
        help="Hugging Face model directory, Hub id (ORG/NAME[@REVISION]), or a run directory (its newest complete "
        "checkpoint, converted once into RUN_DIR/eval/).",
    ),
    k: int | None = typer.Option(
        None, "-k", "--k", min=1, help="Samples per prompt for pass@k and maj@k (task.eval_k; 1 = greedy only)."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="JSON report (default: RUN_DIR/eval/step_N.json for a run, else eval-<model dir>.json here).",
    ),
) -> None:
    """Evaluate a checkpoint on the config's held-out split: greedy accuracy, and pass@k / maj@k with -k > 1,
    scored by the task's own check on the prompts training saw. Writes JSON and prints a table."""
    from rlx.config import load_config
    from rlx.launch.evaluation import run_eval, write_report
    from rlx.orchestrator.evaluate import resolve_model

    with user_errors():
        source = resolve_model(model)
        for note in source.notes:
            err_console.print(f"[yellow]note:[/] skipped {note}", highlight=False)
        extra = [f"model.path={source.path}", "model.build_if_missing="] + ([f"task.eval_k={k}"] if k else [])
        cfg = load_config(config, list(overrides or []) + extra)
        command = ["rlx", "eval", config, *(overrides or []), "--model", model]
        command += (["-k", str(k)] if k else []) + (["--out", str(out)] if out else [])
        try:
            result = run_eval(cfg, source, command)
        except KeyboardInterrupt:
            err_console.print("interrupted: the rollout servers were stopped; nothing was written", highlight=False)
            raise typer.Exit(130) from None
        target = out or _default_out(source)
        write_report(result, target)
    _print_table(result, target)


def _default_out(source) -> Path:
    if source.kind == "run":
        return source.path.parent / f"step_{source.step}.json"
    return Path(f"eval-{source.path.name}.json")


def _print_table(result: dict, target: Path) -> None:
    from rich.table import Table

    model = result["model"]
    title = f"{model['given']}" + (f" (step {model['step']})" if model["step"] is not None else "")
    table = Table(title=title, title_justify="left")
    for column in ("metric", "value", "prompts"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for name, entry in result["metrics"].items():
        table.add_row(name, f"{entry['value']:.4f}", str(entry["count"]))
    console.print(table)
    if logged := result["run_logged"]:
        said = ", ".join(f"{name} {value:.4f}" for name, value in logged.items() if isinstance(value, float))
        console.print(f"the run logged at step {model['step']}: {said}", highlight=False)
    console.print(
        f"{result['task']['held_out']}; {result['sampling']['accuracy']}; engine {result['engine']['backend']}; "
        f"{result['seconds']} s; wrote {target}",
        highlight=False,
    )
