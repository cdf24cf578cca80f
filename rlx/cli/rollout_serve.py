"""`rlx rollout-serve`: run one rollout server (vLLM or transformers) until told to stop."""

from __future__ import annotations

from typing import List, Optional

import typer

from rlx.cli.common import UserError, err_console, user_errors


def rollout_serve(
    config: str = typer.Argument(..., help="YAML run config (model, rollout sections)."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides."),
    address: Optional[str] = typer.Option(None, help="Address to bind: ipc://PATH or tcp://HOST:PORT "
                                                     "(default from rollout.host/port)."),
    index: int = typer.Option(0, help="Server index within the run (names its log, trace and default address)."),
    allow_remote: bool = typer.Option(False, "--allow-remote",
                                      help="Allow binding a non-loopback interface (needs rollout.auth_token)."),
) -> None:
    """Serve generate / pause / resume / weight-update requests over ZeroMQ.

    Exits 3 when the backend's engine dies (after answering every pending request with the cause)."""
    import asyncio
    import logging

    from rlx.config import load_config
    from rlx.engine.model import check_model_dir
    from rlx.rollout.addresses import server_address
    from rlx.rollout.backends.base import make_backend
    from rlx.rollout.server import BackendDied, check_bind_address, run_server
    from rlx.trace import tracer

    with user_errors():
        cfg = load_config(config, overrides or [])
        check_model_dir(cfg.model.path)
        address = address or server_address(cfg, index)
        try:
            check_bind_address(address, allow_remote, cfg.rollout.auth_token)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tracer.configure_from_env("rollout", f"rollout{index}")
    limits = {"max_model_len": cfg.rollout.max_model_len, "request_timeout_s": cfg.rollout.request_timeout_s,
              "sync_timeout_s": cfg.sync.timeout_s}
    try:
        asyncio.run(run_server(make_backend(cfg), address, cfg.rollout.auth_token, **limits))
    except BackendDied as exc:
        err_console.print(f"[bold red]rollout server {address} stopped:[/] {exc}", highlight=False, markup=True)
        raise typer.Exit(3) from None
    finally:
        tracer.close()
