"""`rlx rollout-serve`: run one rollout server (vLLM or transformers) until told to stop.

The auth token never travels on the command line (``ps`` shows argv to every user): it comes from
``rollout.auth_token`` or, when that is empty, from an environment variable (``RLX_ROLLOUT_AUTH_TOKEN``
unless ``--auth-token-env`` names another).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from rlx.cli.common import UserError, err_console, user_errors
from rlx.config.redact import SECRET_ENV

if TYPE_CHECKING:
    from rlx.config.roles import RolloutRole
    from rlx.config.rollout import RolloutConfig, SamplingConfig

TOKEN_ENV = SECRET_ENV["rollout.auth_token"]  # the variable `rlx train` hands its servers the token in


def rollout_serve(
    config: str = typer.Argument(
        ..., help="YAML run config (model, rollout sections), or the rollout role file (.json) `rlx train` writes."
    ),
    overrides: list[str] | None = typer.Argument(None, help="key=value overrides."),
    address: str | None = typer.Option(
        None,
        help="Address to bind: ipc://PATH or tcp://HOST:PORT (default: "
        "tcp://rollout.host:(rollout.port + index) when rollout.port "
        "is set, else ipc://TRAINER.OUTPUT_DIR/rollout-INDEX.sock; the "
        "log's 'listening on' line names it).",
    ),
    host: str | None = typer.Option(
        None,
        help="Bind tcp://HOST:PORT (PORT from --port or rollout.port + "
        "index); a non-loopback HOST needs an auth token.",
    ),
    port: int | None = typer.Option(None, min=1, max=65535, help="TCP port for --host (default rollout.port + index)."),
    auth_token_env: str | None = typer.Option(
        None,
        help=f"Environment variable holding the auth token when rollout.auth_token is empty (default {TOKEN_ENV}).",
    ),
    index: int = typer.Option(0, help="Server index within the run (names its log, trace and default address)."),
    allow_remote: bool = typer.Option(
        False, "--allow-remote", help="Allow binding a non-loopback --address (needs an auth token)."
    ),
    openai_port: int | None = typer.Option(
        None,
        min=1,
        max=65535,
        help="Also serve an OpenAI-compatible HTTP endpoint (/v1/chat/completions) "
        "on this port of rollout.openai_host (default rollout.openai_port "
        "+ index; 0 = off).",
    ),
) -> None:
    """Serve generate / pause / resume / weight-update requests over ZeroMQ (and, with --openai-port,
    OpenAI chat completions over HTTP that record episodes for training).

    Exits 3 when the backend's engine dies (after answering every pending request with the cause)."""
    import asyncio
    import logging

    from rlx.rollout.backends.base import make_backend
    from rlx.rollout.priority import apply_from_env
    from rlx.rollout.server import BackendDied, run_server
    from rlx.trace import tracer
    from rlx.trainer.model import check_model_dir

    with user_errors():
        cfg = _role(config, overrides or [])
        check_model_dir(cfg.model.path)
        cfg.rollout.auth_token = cfg.rollout.auth_token or _token_from_env(auth_token_env)
        address = _bind_address(cfg, address, host, port, index, allow_remote)
        http_socket = _openai_socket(cfg.rollout, openai_port, index)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if apply_from_env():
        logging.getLogger("rlx.rollout.server").info("running at idle CPU priority (rollout.yield_cpu)")
    tracer.configure_from_env("rollout", f"rollout{index}")
    limits = {
        "max_model_len": cfg.rollout.max_model_len,
        "request_timeout_s": cfg.rollout.request_timeout_s,
        "sync_timeout_s": cfg.sync.timeout_s,
    }
    code = 0
    if http_socket is None:
        serving = run_server(make_backend(cfg), address, cfg.rollout.auth_token, **limits)
    else:
        from rlx.rollout.openai_http import run_with_openai

        serving = run_with_openai(
            make_backend(cfg),
            address,
            cfg.rollout.auth_token,
            http_socket,
            _served_name(cfg.model.path),
            _default_sampling(cfg.sampling),
            max_body_mb=cfg.rollout.openai_max_body_mb,
            **limits,
        )
    try:
        asyncio.run(serving)
    except BackendDied as exc:
        err_console.print(f"[bold red]rollout server {address} stopped:[/] {exc}", highlight=False, markup=True)
        code = 3
    finally:
        tracer.close()
    _exit_now(code)


def _exit_now(code: int) -> None:
    """End the process once the server has stopped and closed its backend, skipping the interpreter's
    teardown: its final garbage collection of vLLM's heap (pydantic configs, bound kernels) takes
    5-10 s on two cores and frees nothing the exit does not."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _role(config: str, overrides: list[str]) -> RolloutRole:
    """What this server reads of the run: the role file `rlx train` wrote (``rlx.config.roles``), or the rollout
    role cut from a whole run config given by hand."""
    from rlx.config import load_config
    from rlx.config.roles import RolloutRole, read_role, rollout_role

    if config.endswith(".json"):
        if overrides:
            raise UserError(
                f"{config} is a rollout role file, which takes no overrides ({' '.join(overrides)}); "
                "pass the run's YAML config to override keys"
            )
        return read_role(config, RolloutRole)
    from rlx.formats.hub import resolve

    role = rollout_role(load_config(config, overrides))
    snap = resolve(role.model.path, "model.path", role.model.revision, "model.revision")  # a judge's Hub id
    if snap is not None:
        role.model.path, role.model.revision = snap.path, snap.commit
    return role


def _served_name(path: str) -> str:
    """The model name the OpenAI endpoint answers to: a Hub snapshot's id, else the directory's name."""
    from rlx.formats.hub import snapshot_of

    snap = snapshot_of(path)
    return snap.repo_id if snap is not None else Path(path).name


def _openai_socket(rollout: RolloutConfig, port: int | None, index: int):
    """The OpenAI endpoint's bound socket (--openai-port, else rollout.openai_port + index), or None when off."""
    port = port if port is not None else rollout.openai_port + index if rollout.openai_port else None
    if port is None:
        return None
    from rlx.rollout.openai_http import check_http_bind, listen_socket

    try:
        check_http_bind(rollout.openai_host, rollout.auth_token)
        return listen_socket(rollout.openai_host, port)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _default_sampling(s: SamplingConfig):
    from rlx.rollout.protocol import SamplingSpec

    return SamplingSpec.of(s, n=1)


def _cannot_bind_tcp(address: str) -> str:
    """Why ``tcp://HOST:PORT`` cannot be bound now (the port is taken, the host is not this machine's), or "".
    Checked before the model loads, with the SO_REUSEADDR that ZeroMQ sets."""
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(address)
    if parsed.hostname in (None, "*") or not parsed.port:
        return ""
    try:
        family = socket.getaddrinfo(parsed.hostname, parsed.port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((parsed.hostname, parsed.port))
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


def _someone_listens(socket_file: Path) -> bool:
    """Whether a live process accepts connections on the Unix socket ``socket_file`` (a file left by a dead
    server refuses them)."""
    import socket

    if not socket_file.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(socket_file))
        except OSError:
            return False
    return True


def _token_from_env(variable: str | None) -> str:
    """The token in ``variable`` (default RLX_ROLLOUT_AUTH_TOKEN); a variable named explicitly must be set."""
    token = os.environ.get(variable or TOKEN_ENV, "")
    if variable and not token:
        raise UserError(
            f"--auth-token-env {variable}: the environment variable {variable} is unset or empty; "
            f"export the shared secret in it (e.g. {variable}=... rlx rollout-serve ...)"
        )
    return token


def _bind_address(
    cfg: RolloutRole, address: str | None, host: str | None, port: int | None, index: int, allow_remote: bool
) -> str:
    """The address to bind: --address, or tcp://--host:port, or the run's default for ``index``."""
    from rlx.net import MAX_IPC_PATH_BYTES, ipc_path, server_address
    from rlx.rollout.server import check_bind_address

    if index < 0:
        raise UserError(f"--index {index} must be >= 0 (the server's number within the run)")
    if host is not None and address is not None:
        raise UserError(f"--address {address} and --host {host} both say where to bind; pass one of them")
    if port is not None and host is None:
        raise UserError(f"--port {port} needs --host (or pass --address tcp://HOST:{port})")
    if host is not None:
        port = port if port is not None else cfg.rollout.port + index if cfg.rollout.port else None
        if port is None:
            raise UserError(f"--host {host} needs a port: pass --port PORT or set rollout.port")
        address, allow_remote = f"tcp://{host}:{port}", True  # naming the host is the explicit request
    address = address or server_address(cfg.rollout, cfg.run_dir, index)
    try:
        check_bind_address(address, allow_remote, cfg.rollout.auth_token)
    except ValueError as exc:
        if allow_remote and not cfg.rollout.auth_token:
            raise UserError(
                f"binding {address} needs an auth token: export it in {TOKEN_ENV} (or the variable "
                "--auth-token-env names), or set rollout.auth_token"
            ) from None
        raise UserError(str(exc)) from None
    socket_file = ipc_path(address)
    if socket_file is not None:
        if not socket_file.parent.is_dir():
            raise UserError(f"--address {address}: the directory {socket_file.parent} does not exist; create it first")
        if len(os.fsencode(socket_file)) > MAX_IPC_PATH_BYTES:
            raise UserError(
                f"--address {address}: an ipc socket path is at most {MAX_IPC_PATH_BYTES} bytes "
                "(the Unix socket limit); choose a shorter path"
            )
        if _someone_listens(socket_file):  # binding would take the address from that server without a word
            raise UserError(f"--address {address}: another process is serving there; stop it or choose another path")
    elif address.startswith("tcp://"):
        problem = _cannot_bind_tcp(address)
        if problem:
            raise UserError(f"--address {address}: cannot bind it ({problem}); choose a free port of this machine")
    return address
