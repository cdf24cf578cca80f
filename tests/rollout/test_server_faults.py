"""Faults a rollout server must survive: failed weight updates, out-of-range and malformed
requests, requests that outlive their deadline. Each runs against a real `rlx rollout-serve`."""

import asyncio
from typing import NamedTuple

import msgspec
import pytest
import torch
import zmq

from rlx.rollout import protocol as p
from rlx.rollout.client import RolloutClient, RolloutServerError
from rlx.sync.errors import SyncError
from rlx.sync.messages import SyncBegin, SyncEnd
from rlx.sync.sender import WeightSender
from rlx.sync.transports.shm import ShmBuffer
from tests.helpers import serve_with

SYNC_TIMEOUT_S = 2.0
HF_MAX_MODEL_LEN = 1024
GREEDY = p.SamplingSpec(n=1, temperature=0.0, max_tokens=4)


class Server(NamedTuple):
    address: str
    max_model_len: int
    silent_sender_expires: bool  # whether a sync whose sender went silent is aborted within the test


@pytest.fixture(scope="module")
def hf_server(tiny_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("faults")
    with serve_with(
        tiny_model_dir,
        work,
        "hf",
        rollout={"backend": "hf", "max_model_len": HF_MAX_MODEL_LEN},
        sync={"timeout_s": SYNC_TIMEOUT_S},
    ) as (address, _):
        yield address


@pytest.fixture(params=["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def server(request) -> Server:
    if request.param == "hf":
        return Server(request.getfixturevalue("hf_server"), HF_MAX_MODEL_LEN, True)
    return Server(request.getfixturevalue("vllm_server"), 512, False)  # the shared server: default config


def run_with_client(address, scenario):
    async def go():
        client = RolloutClient([address], timeout_s=60.0)
        try:
            return await scenario(client)
        finally:
            client.close()

    return asyncio.run(go())


def model_weights(model_dir) -> list[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return [(name, param.detach().contiguous()) for name, param in model.named_parameters()]


def test_every_failed_weight_update_leaves_the_server_generating_and_syncing(server, tiny_model_dir):
    address, _, silent_sender_expires = server
    weights = model_weights(tiny_model_dir)

    async def generates(client):
        result = await client.generate(["3+4="], GREEDY, timeout_s=60.0)
        assert result[0].samples[0].token_ids

    async def begin(client, sync_id, buffer, num_tensors=-1):
        return await client.channel(0).call(SyncBegin(sync_id, buffer.handle(), num_tensors, -1, False), 60.0)

    async def scenario(client):
        version = (await client.health())[0].weight_version
        buffer = ShmBuffer(4096, 2)
        try:
            # begin: a handle naming a file outside the rlx segments is refused before anything is opened
            bad = buffer.handle()
            bad.payload["name"] = "../../etc/passwd"
            ack = await client.channel(0).call(SyncBegin(9001, bad, -1, -1, False), 60.0)
            assert not ack.ok and "not an rlx sync segment" in ack.error and not ack.in_sync
            await generates(client)
            # mid-bucket: a tensor the model does not have fails its bucket; the sender gives up
            with WeightSender(transport="shm", bucket_mb=1, timeout_s=30.0) as sender, pytest.raises(SyncError):
                await sender.send([("no.such.parameter", torch.zeros(8))], client.channels())
            await generates(client)
            # end: fewer tensors arrived than the begin announced
            await begin(client, 9002, buffer, num_tensors=3)
            ack = await client.channel(0).call(SyncEnd(9002), 60.0)
            assert not ack.ok and "announced 3" in ack.error
            await generates(client)
            # a sender that vanishes after its begin: the next sync aborts the stale one
            assert (await begin(client, 9003, buffer)).in_sync
            if silent_sender_expires:  # ... and on its own, after sync.timeout_s, generation goes on
                await generates(client)
            with WeightSender(transport="shm", bucket_mb=1, timeout_s=60.0, verify=True) as sender:
                report = await sender.send(weights, client.channels())
            assert report.verified and report.num_tensors == len(weights)
            await generates(client)
            assert (await client.health())[0].weight_version == version + 1
        finally:
            buffer.close()

    run_with_client(address, scenario)


def test_out_of_range_generate_requests_are_refused_naming_the_field(server):
    bad_sampling = {
        "n": [0, -1, 10**6],
        "top_p": [1.5, 0.0, float("nan")],
        "temperature": [-0.5, float("inf"), 1e-40, 0.005],
        "top_k": [-2],
        "max_tokens": [0, 10**9],
        "seed": [-1],
    }
    long_prompt = "1+" * server.max_model_len

    async def scenario(client):
        for field, values in bad_sampling.items():
            for value in values:
                with pytest.raises(RolloutServerError, match=f"sampling.{field}=.* out of range; allowed"):
                    await client.generate(["1+1="], msgspec.structs.replace(GREEDY, **{field: value}))
        with pytest.raises(RolloutServerError, match="max_model_len"):
            await client.generate([long_prompt], GREEDY)
        with pytest.raises(RolloutServerError, match="max_model_len"):
            await client.generate([[5] * server.max_model_len], GREEDY)
        with pytest.raises(RolloutServerError, match="negative token id"):
            await client.call(0, p.Generate(prompt_token_ids=[[5, -3]], sampling=GREEDY))
        for request in (
            p.Generate(prompt_token_ids=[[5, 2**40]], sampling=GREEDY),
            p.ScoreTokens(token_ids=[[5, 6, 10**6]], start=[1]),
        ):  # would index past the embedding
            with pytest.raises(RolloutServerError, match="past the model's vocabulary; token ids are in"):
                await client.call(0, request)
        # max_tokens within range but past the room the prompt leaves: capped, not refused
        near_full = [5] * (server.max_model_len - 3)
        result = await client.generate([near_full], msgspec.structs.replace(GREEDY, max_tokens=100))
        assert 1 <= len(result[0].samples[0].token_ids) <= 3

    run_with_client(server.address, scenario)


def test_malformed_messages_get_an_error_reply_fast_and_the_server_stays_up(server):
    address = server.address
    deep = b"\x91" * 200_000 + b"\xc0"  # a msgpack array nested 200k deep
    nested = msgspec.msgpack.encode({"id": 41, "body": {"type": "generate", "prompts": "DEEP"}})
    nested = nested.replace(msgspec.msgpack.encode("DEEP"), deep)
    messages = [
        (b"\x00\x01not msgpack", -1, "malformed request"),
        (msgspec.msgpack.encode({"id": 42, "body": {"type": "format_disk"}}), 42, "malformed request"),
        (
            msgspec.msgpack.encode({"id": 43, "body": {"type": "generate", "sampling": {"stop": [[[]]]}}}),
            43,
            "malformed request",
        ),
        (nested, -1, "malformed request"),
    ]  # refused at the first level that has the wrong type
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(address)
    try:
        for payload, request_id, error in messages:
            sock.send(payload)
            reply = p.decode_reply(sock.recv())
            assert not reply.ok and error in reply.error
            assert reply.id == request_id  # the caller's id whenever that much decodes, so it need not time out
    finally:
        sock.close()
        ctx.term()
    run_with_client(address, lambda client: client.generate(["1+1="], GREEDY))


def test_a_request_past_its_deadline_stops_generating_and_frees_the_server(hf_server):
    """16 greedy prompts for the whole context (minutes of work on this model) with a 2 s deadline:
    the server cuts them off at the deadline, so the next request is answered, and n > 1 greedy works."""
    hog = p.Generate(prompts=["1+1="] * 16, sampling=p.SamplingSpec(temperature=0.0, max_tokens=HF_MAX_MODEL_LEN - 8))

    async def scenario(client):
        with pytest.raises(RolloutServerError, match="did not answer|deadline"):
            await client.call(0, hog, timeout_s=2.0)
        result = await client.generate(["2+2="], msgspec.structs.replace(GREEDY, n=3), timeout_s=60.0)
        assert len({tuple(s.token_ids) for s in result[0].samples}) == 1 and len(result[0].samples) == 3

    run_with_client(hf_server, scenario)


def test_empty_prompts_and_bad_sleep_requests_are_refused_and_sigterm_removes_the_socket_file(tiny_model_dir, tmp_path):
    """An empty text prompt, a Sleep level other than 1 or 2 and unknown WakeUp tags are refused (the server
    keeps generating); SIGTERM then ends the server, answers the request it was generating that it stopped
    (not left to the client's timeout, nothing logged as never retrieved) and removes its ipc socket file."""
    import os
    import signal
    from pathlib import Path

    with serve_with(tiny_model_dir, tmp_path, "server-hf", rollout={"backend": "hf"}) as (address, proc):

        async def scenario(client):
            with pytest.raises(RolloutServerError, match="prompt 0 is empty"):
                await client.generate([""], GREEDY)
            with pytest.raises(RolloutServerError, match="sleep level 99"):
                await client.call(0, p.Sleep(level=99))
            with pytest.raises(RolloutServerError, match="wake_up tags"):
                await client.call(0, p.WakeUp(tags=["bogus"]))
            assert (await client.generate(["1+1="], GREEDY))[0].samples[0].token_ids

        run_with_client(address, scenario)
        socket_file = Path(address.removeprefix("ipc://"))
        assert socket_file.exists()

        async def stopped_mid_generate(client):
            long = p.SamplingSpec(n=64, temperature=1.0, max_tokens=400)
            work = asyncio.create_task(client.generate([f"{i}+{i}=" for i in range(4)], long, timeout_s=60.0))
            while (await client.call(0, p.Stats())).in_flight == 0:  # in the server, not just sent
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # and in the engine
            assert not work.done(), "the request ended before the server was stopped"
            os.killpg(proc.pid, signal.SIGTERM)
            with pytest.raises(RolloutServerError) as err:
                await work
            return str(err.value)

        error = run_with_client(address, stopped_mid_generate)
        assert p.SERVER_STOPPING in error, error
        assert proc.wait(30) == 0
        assert not socket_file.exists()
        log = (tmp_path / "server-hf.log").read_text()
        assert "never retrieved" not in log and "Traceback" not in log, log[-3000:]


def test_a_request_the_server_had_not_read_when_it_stopped_is_answered_that_it_is_stopping(tiny_model_dir, tmp_path):
    """A request that reached the server's socket but not the server before SIGTERM (sent while the server is
    held by SIGSTOP, then SIGTERM and SIGCONT) is answered that the server is stopping, so its caller can send it
    to a live server at once instead of waiting out its timeout."""
    import os
    import signal

    with serve_with(tiny_model_dir, tmp_path, "server-unread", rollout={"backend": "hf"}) as (address, proc):

        async def sent_as_it_stops(client):
            long = p.SamplingSpec(n=64, temperature=1.0, max_tokens=400)
            await client.call(0, p.Health())  # connected: what is sent next reaches the server's socket
            os.killpg(proc.pid, signal.SIGSTOP)
            try:
                work = asyncio.create_task(client.generate(["1+1="], long, timeout_s=30.0))
                await asyncio.sleep(0.5)  # sent: in the server's socket, unread
                os.killpg(proc.pid, signal.SIGTERM)
            finally:
                os.killpg(proc.pid, signal.SIGCONT)
            with pytest.raises(RolloutServerError) as err:
                await work
            return str(err.value)

        error = run_with_client(address, sent_as_it_stops)
        assert p.SERVER_STOPPING in error, error
        proc.wait(30)
        assert proc.returncode == 0
