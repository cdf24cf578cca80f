"""Is a Ray cluster listening at the address `rlx train launcher=ray` and `rlx doctor` are told to join?

``ray.init`` joining an address where no cluster answers retries for many minutes (about 35 s per try,
20 tries), logging a GCS warning every few seconds. ``check_reachable`` asks first, within seconds: it
connects to HOST:PORT (``CONNECT_TIMEOUT_S``) and opens an HTTP/2 session, as every gRPC client does,
since the cluster's GCS and the Ray Client server (``ray://``) are gRPC servers: a port that refuses,
or that accepts but does not answer with HTTP/2 (another service, such as the dashboard), is named
with the fix. With ``RAY_USE_TLS`` set the session starts with TLS instead, so only the connection is
checked. ``auto`` (the cluster started on this host) is left to ``ray.init``.
"""

from __future__ import annotations

import os
import socket

from rlx.net import is_loopback_host

CONNECT_TIMEOUT_S = 5.0
"""How long the address has to accept a connection, and then to answer the HTTP/2 preface."""
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame
_SETTINGS = 4


def check_reachable(address: str, where: str) -> str:
    """Why nothing at ``address`` (the value of ``where``: ray.address or RAY_ADDRESS) answers as a Ray cluster,
    as an error message naming the fix; "" when something does, or when ``address`` is not HOST:PORT."""
    target = host_port(address)
    if target is None:
        return ""
    host, port = target
    problem = _grpc_problem(host, port)
    if problem and is_loopback_host(host):  # ray.init dials this node's own IP for a loopback address
        import ray

        if not _grpc_problem(ray.util.get_node_ip_address(), port):
            return ""
    if not problem:
        return ""
    return (
        f"{where}={address!r}: {problem}; check the address (the head node's `ray start --head` prints it, and "
        f"`ray status` there shows the cluster is up) and that this host reaches it, or leave {where} empty to "
        "start a local Ray instance"
    )


def host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of ``[ray://]HOST:PORT`` (the forms ``rlx.config.ray.check_ray_address`` lets through),
    or None for ``auto``, ``local`` and anything else."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def _grpc_problem(host: str, port: int) -> str:
    """ "" when ``host:port`` accepts a connection and answers the HTTP/2 preface with its SETTINGS frame."""
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except TimeoutError:
        return f"nothing accepted a connection at {host}:{port} within {CONNECT_TIMEOUT_S:g} s"
    except OSError as exc:
        return f"cannot connect to {host}:{port} ({exc.strerror or exc})"
    with sock:
        if os.environ.get("RAY_USE_TLS", "0").lower() not in ("", "0", "false"):
            return ""
        try:
            sock.sendall(_PREFACE)
            head = _read(sock, 9)
        except OSError:  # a reset or a timeout: not a gRPC server either way
            head = b""
    if len(head) == 9 and head[3] == _SETTINGS:
        return ""
    return (
        f"{host}:{port} accepts connections but does not answer as a Ray cluster (a gRPC server) does; it may "
        "be another service's port (the dashboard's, 8265, is not the cluster address)"
    )


def _read(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            break
        data += chunk
    return data
