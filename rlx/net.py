"""Addresses of rollout servers: a run's defaults, and whether an address stays on this host."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:
    from rlx.config.rollout import RolloutConfig


def server_address(rollout: RolloutConfig, run_dir: str, index: int) -> str:
    """tcp://host:(port+index) when rollout.port is set, else an ipc:// socket in the run directory."""
    if rollout.port:
        return f"tcp://{rollout.host}:{rollout.port + index}"
    path = Path(run_dir).resolve() / f"rollout-{index}.sock"
    path.parent.mkdir(parents=True, exist_ok=True)
    if len(os.fsencode(path)) > MAX_IPC_PATH_BYTES:  # too long for a Unix socket: a short name in the temp dir
        digest = hashlib.sha256(os.fsencode(path.parent)).hexdigest()[:12]
        path = Path(tempfile.gettempdir()) / f"rlx-{digest}-rollout-{index}.sock"
    return f"ipc://{path}"


MAX_IPC_PATH_BYTES = 107
"""The longest path a Unix socket (an ``ipc://`` address) may have, in bytes."""


def engine_socket_dir(pid: int) -> Path:
    """Where the vLLM engine of the server process ``pid`` binds its ``ipc://`` sockets (``VLLM_RPC_BASE_PATH``):
    a directory of its own, which the server removes when it closes and the launcher when the server's process
    group is gone (an engine core killed before it unlinks them leaves its sockets in the temp dir otherwise)."""
    return Path(tempfile.gettempdir()) / f"rlx-engine-{pid}"


def ipc_path(address: str) -> Path | None:
    """The socket file of an ``ipc://`` address; None for any other scheme."""
    return Path(address[len("ipc://") :]) if address.startswith("ipc://") else None


def is_loopback_address(address: str) -> bool:
    """``ipc://``/``inproc://``, or ``tcp://`` to a loopback host."""
    if address.startswith(("ipc://", "inproc://")):
        return True
    return is_loopback_host(urlparse(address).hostname or "")


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``host`` now (it may be taken before it is used: bind it soon)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
