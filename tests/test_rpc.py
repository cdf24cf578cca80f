"""The request/reply helper and its sockets, over real ZeroMQ sockets: options set by the factory, a blocking
call that drops the late reply to a request that timed out, and one that gives up at its deadline."""

import threading
import time

import zmq

from rlx import rpc


def test_the_factory_sets_the_same_options_on_both_ends(tmp_path):
    context = zmq.Context()
    address = f"ipc://{tmp_path}/r.sock"
    server = rpc.router(context, address, hwm=0, max_message_bytes=4096)
    client = rpc.dealer(context, address, hwm=7, immediate=True)
    try:
        assert server.getsockopt(zmq.LINGER) == 0 and client.getsockopt(zmq.LINGER) == 0
        assert server.getsockopt(zmq.SNDHWM) == 0 and server.getsockopt(zmq.MAXMSGSIZE) == 4096
        assert client.getsockopt(zmq.RCVHWM) == 7 and client.getsockopt(zmq.IMMEDIATE) == 1
    finally:
        client.close()
        server.close()
        context.term()


def test_a_blocking_call_drops_a_late_reply_and_gives_up_at_its_deadline(tmp_path):
    context = zmq.Context()
    address = f"ipc://{tmp_path}/r.sock"
    server = rpc.router(context, address)
    client = rpc.dealer(context, address)

    def serve():  # answers request 1 only after request 2 arrived, then answers request 2; ignores request 3
        first = server.recv_multipart()
        second = server.recv_multipart()
        server.send_multipart(rpc.reply_frames(first, b"late"))
        server.send_multipart(rpc.reply_frames(second, b"two"))
        server.recv_multipart()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert rpc.call_blocking(client, 1, b"one", time.monotonic() + 0.2) is None  # no answer in time
        assert rpc.call_blocking(client, 2, b"two?", time.monotonic() + 10) == [b"two"]  # "late" dropped
        assert rpc.call_blocking(client, 3, b"three", time.monotonic() + 0.3) is None  # never answered
    finally:
        thread.join(10)
        client.close()
        server.close()
        context.term()
