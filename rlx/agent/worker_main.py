"""The worker process behind ``rlx.agent.workers.WorkerPool`` (``python -m rlx.agent.worker_main``).

It reads requests from stdin and writes replies to its original stdout, each a 4-byte big-endian
length then msgpack (never pickle): request ``{"fn": "module:function", "args": [...]}``, reply
``{"ok": bool, "value": ..., "error": str}``. The function's own prints go to stderr, so they
cannot corrupt a reply; the pool reads that pipe and shows at most ``agent.max_worker_output_bytes`` of
it per call. The address-space limit (``--memory-mb``, RLIMIT_AS) is set before any
user code is imported; a string result longer than ``--max-output-chars`` is truncated here, so a
huge output never crosses the pipe. Timeouts are the pool's job: it kills this process group; the
worker also dies with the process that started it (PR_SET_PDEATHSIG on Linux).
"""

from __future__ import annotations

import argparse
import importlib
import os
import resource
import struct
import sys

import msgspec

MAX_REQUEST_BYTES = 64 << 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory-mb", type=int, default=0)
    parser.add_argument("--max-output-chars", type=int, default=4096)
    parser.add_argument("--parent", type=int, default=0)
    args = parser.parse_args()
    _die_with_parent(args.parent)
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if args.memory_mb > 0:
        limit = args.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    requests = sys.stdin.buffer
    functions: dict[str, object] = {}
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(dict)
    ready = encoder.encode({"ok": True, "value": "ready", "error": ""})
    replies.write(struct.pack(">I", len(ready)) + ready)  # the pool times calls only once a worker is up
    while True:
        header = requests.read(4)
        if len(header) < 4:
            return
        (size,) = struct.unpack(">I", header)
        if size > MAX_REQUEST_BYTES:
            return
        request = decoder.decode(requests.read(size))
        reply = _call(functions, request, args.max_output_chars)
        try:
            body = encoder.encode(reply)
        except (TypeError, OverflowError) as exc:
            body = encoder.encode({"ok": False, "value": None, "error": f"result cannot be sent: {exc}"})
        replies.write(struct.pack(">I", len(body)) + body)


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this worker when the process that started it dies, even if a call is stuck."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent and os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _call(functions: dict, request: dict, max_chars: int) -> dict:
    try:
        ref = request["fn"]
        if ref not in functions:
            module, _, name = ref.partition(":")
            functions[ref] = getattr(importlib.import_module(module), name)
        value = functions[ref](*request.get("args", []))
    except MemoryError:
        return {"ok": False, "value": None, "error": "MemoryError: the call passed its memory limit"}
    except Exception as exc:  # noqa: BLE001 - user code may raise anything; the caller gets its message
        return {"ok": False, "value": None, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return {"ok": True, "value": value, "error": ""}
    text = value if isinstance(value, str) else str(value)
    if len(text) > max_chars:
        text = text[:max_chars] + f"...[truncated {len(text) - max_chars} chars]"
    return {"ok": True, "value": text, "error": ""}


if __name__ == "__main__":
    main()
