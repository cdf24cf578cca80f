"""A receiver process: a ROUTER socket in front of one ``rlx.sync.receiver.SyncHandler`` (bench, tests).

``serve`` is the socket loop; ``main`` runs it as
``python -m rlx.sync.receiver_process --address ipc:///tmp/x.sock``, with a consumer that copies
each tensor into its own preallocated destination (standing in for ``load_weights``). The
handler answers every request, failed ones with an error ``BucketAck``, and the loop keeps serving. The process exits on
SIGTERM/SIGINT and when its parent (``--parent-pid``) is gone, so a crashed bench never leaves it behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time

import torch
import zmq

from rlx import rpc
from rlx.rpc import reply_frames
from rlx.sync.checksum import tensor_checksum
from rlx.sync.copy import copy_bytes
from rlx.sync.messages import NO_ID, BucketAck, encode
from rlx.sync.receiver import Consumer, SyncHandler, WeightReceiver


class CopyConsumer(Consumer):
    """Copies each tensor into its own destination, allocated the first time its name is seen.

    ``hold_s`` sleeps before returning (so the ack comes late) and, with ``check_intact``, then
    checks that the slot bytes it was handed did not change meanwhile -- a test of the sender's
    promise never to overwrite a slot before its ack.
    """

    def __init__(self, hold_s: float = 0.0, check_intact: bool = False):
        self.destinations: dict[str, torch.Tensor] = {}
        self.hold_s, self.check_intact = hold_s, check_intact

    def load(self, tensors: list[tuple[str, torch.Tensor]], verify: bool) -> dict[str, int] | None:
        before = {name: tensor_checksum(t) for name, t in tensors} if self.check_intact else None
        for name, t in tensors:
            dst = self.destination(name, t.dtype, list(t.shape), _own(t.device))
            if dst.data_ptr() != t.data_ptr():
                copy_bytes(dst, t)
        if self.hold_s:
            time.sleep(self.hold_s)
        if before is not None:
            changed = [name for name, t in tensors if tensor_checksum(t) != before[name]]
            if changed:
                raise RuntimeError(f"slot bytes changed before the ack: {', '.join(changed)}")
        return {name: tensor_checksum(self.destinations[name]) for name, _ in tensors} if verify else None

    def destination(self, name: str, dtype: torch.dtype, shape: list[int], device: torch.device) -> torch.Tensor:
        dst = self.destinations.get(name)
        if dst is None or dst.dtype != dtype or list(dst.shape) != shape or dst.device != device:
            dst = torch.empty(shape, dtype=dtype, device=device)
            dst.view(-1).view(torch.uint8).fill_(0)  # touch every page now, not during a timed sync
            self.destinations[name] = dst
        return dst


def serve(address: str, handler: SyncHandler, parent_pid: int | None = None, poll_s: float = 0.5) -> None:
    """Serve requests on ``address`` until SIGTERM/SIGINT or the parent process is gone.

    Socket invariants (ROUTER): it binds, senders connect (one DEALER each); every request gets
    exactly one reply to the identity it came from; ``LINGER=0`` so exit never blocks;
    ``RCVHWM=SNDHWM=1000`` messages; a reply to a sender that is gone is dropped by ZeroMQ (the
    sender's own deadline reports it). Requests are served one at a time, in arrival order.
    """
    context = zmq.Context()
    socket = rpc.router(context, None, hwm=1000)
    try:
        socket.bind(address)
        print(json.dumps({"ready": address, "pid": os.getpid()}), flush=True)
        while parent_pid is None or os.getppid() == parent_pid:
            if socket.poll(int(poll_s * 1000), zmq.POLLIN):
                socket.send_multipart(frames_reply(socket.recv_multipart(), handler))
    finally:
        handler.close()
        socket.close(linger=0)
        context.term()
        if address.startswith("ipc://"):
            with contextlib.suppress(OSError):
                os.unlink(address.removeprefix("ipc://"))


def frames_reply(frames: list[bytes], handler: SyncHandler) -> list[bytes]:
    """``[identity, request_id, request]`` -> ``[identity, request_id, reply]``; a request of any
    other shape gets an error reply with an empty request id."""
    if len(frames) == 3:
        return reply_frames(frames, handler.handle_bytes(frames[2]))
    error = BucketAck(
        NO_ID,
        NO_ID,
        ok=False,
        error=f"{handler.name}: malformed sync request: expected [request_id, payload] frames, got {len(frames) - 1}",
    )
    return [frames[0], b"", encode(error)]


def _own(device: torch.device) -> torch.device:
    """Where this receiver keeps its copy: its own GPU (cuda:0 of what it sees) for a buffer on a GPU, which may
    be another GPU's (CUDA IPC peer-to-peer), as a rollout engine keeps its weights on its own GPU."""
    return torch.device("cuda", torch.cuda.current_device()) if device.type == "cuda" else device


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    torch.set_num_threads(args.torch_threads)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    consumer = CopyConsumer(args.hold_s, args.check_intact)
    assemble = consumer.destination if args.assemble_in_place else None
    receiver = WeightReceiver(args.name, assemble_into=assemble)
    with contextlib.suppress(KeyboardInterrupt):
        serve(args.address, SyncHandler(receiver, consumer), args.parent_pid)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rlx.sync.receiver_process", description=__doc__.split("\n")[0])
    p.add_argument("--address", required=True, help="ZeroMQ address to bind, e.g. ipc:///tmp/rlx-sync.sock")
    p.add_argument("--name", default="receiver process", help="how errors name this receiver")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process is no longer the parent")
    p.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads for the copies")
    p.add_argument("--hold-s", type=float, default=0.0, help="testing: sleep this long before each ack")
    p.add_argument(
        "--check-intact", action="store_true", help="testing: fail a bucket whose slot bytes changed before its ack"
    )
    p.add_argument(
        "--assemble-in-place",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="assemble split tensors straight into their destinations (saves one copy)",
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    main()
