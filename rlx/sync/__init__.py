"""Trainer -> rollout weight transfer.

A ``WeightSender`` (trainer side) streams named tensors into buckets of a shared buffer and
sends one ``BucketMeta`` per bucket over a ``SyncChannel``; on the other side one
``SyncHandler`` per receiver dispatches each request's bytes to a ``WeightReceiver``, which maps
the same buffer and hands out the tensors of each bucket, and to the host's consumer
(``load_weights``); the bucket is acknowledged only after they were consumed. Two slots let the
sender fill bucket k+1 while the receiver loads bucket k.

    messages.py         wire structs (msgspec), versioned; no pickle anywhere
    layout.py           bucket layout: aligned offsets, tensors larger than a slot are split
    transports/         where the bytes go: shm (POSIX shared memory), cuda_ipc (one GPU host),
                        dist (gloo / nccl broadcast, across hosts: one process group per sync)
    arena.py            a one-rank trainer's weights in the shared buffer: syncs send offsets, no slots
    factory.py          picks transport, arena (zero-copy) and sender from the config (controller, bench)
    channel.py          the SyncChannel protocol the sender talks through, and RpcSyncChannel: the
                        SyncChannel to a receiver process or (in the rollout client's envelope) a rollout
                        server, over the ZeroMQ request/reply helper ``rlx.rpc``
    sender.py           WeightSender
    receiver.py         SyncHandler: the one dispatch and error path of every receiving host
                        (receiver process, vLLM worker extension, hf backend), and the
                        WeightReceiver it drives: the buffer's bytes as tensors, checked
    receiver_process.py a ROUTER loop serving a SyncHandler (bench, tests)
    local_receiver.py   start / stop such a process by pid, with a channel to it
    checksum.py         per-tensor checksums for end-to-end verification
    dtypes.py, errors.py  dtype names on the wire; SyncError / SyncTimeout

Nothing is imported here so that ``import rlx.sync`` stays free of torch; import the modules.
"""
