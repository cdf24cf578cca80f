"""The OpenAI-compatible endpoint of `rlx rollout-serve`: completions, recorded episodes, auth, and a
real `rlx train` run (task.name=external) that trains on episodes an outside client drove over HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest

from rlx.config.roles import rollout_role
from rlx.orchestrator.external import episode_rows
from rlx.rollout import protocol as p
from rlx.rollout.client import RolloutClient
from tests.helpers import start_rlx, stop_group, write_config

TOKEN = "test-secret-token"
TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_BODY_MB = 0.25


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc, log, headers=None, timeout_s: float = 240.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/v1/models", headers=headers, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} not ready:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def chat_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with a chat template in its tokenizer (characters of its alphabet only)."""
    import shutil

    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("chat_model") / "model"
    shutil.copytree(tiny_model_dir, path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def openai_work(tmp_path_factory):
    """The directory of the endpoint fixture's server: its config and its log (serve.log)."""
    return tmp_path_factory.mktemp("openai")


@pytest.fixture(scope="module")
def endpoint(chat_model_dir, openai_work):
    """A real hf-backend server whose OpenAI endpoint binds every interface, which needs the token."""
    work = openai_work
    port = free_port()
    config = write_config(
        work / "serve.yaml",
        chat_model_dir,
        rollout={"backend": "hf", "openai_host": "0.0.0.0", "openai_port": port, "openai_max_body_mb": MAX_BODY_MB},
    )
    address = f"ipc://{work}/serve.sock"
    log = work / "serve.log"
    proc = start_rlx(["rollout-serve", str(config), "--address", address], log, env={"RLX_ROLLOUT_AUTH_TOKEN": TOKEN})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url, proc, log, AUTH)
        yield url, address
    finally:
        stop_group(proc)


def zmq_call(address: str, body):
    async def call():
        client = RolloutClient([address], token=TOKEN)
        try:
            return await client.call(0, body, timeout_s=60.0)
        finally:
            client.close()

    return asyncio.run(call())


def chat(url: str, messages, episode: str | None = None, **extra) -> dict:
    headers = dict(AUTH, **({"X-Episode-Id": episode} if episode else {}))
    reply = httpx.post(
        f"{url}/v1/chat/completions",
        headers=headers,
        timeout=60.0,
        json={"model": "tiny", "messages": messages, **extra},
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_completion_returns_text_usage_logprobs_and_records_what_the_engine_sampled(endpoint, chat_model_dir):
    from transformers import AutoTokenizer

    url, address = endpoint
    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    messages = [{"role": "user", "content": "12+7="}]
    response = chat(url, messages, episode="single", max_tokens=6, temperature=0.0, logprobs=True)
    choice, usage, meta = response["choices"][0], response["usage"], response["rlx"]
    assert response["object"] == "chat.completion" and choice["message"]["role"] == "assistant"
    assert meta["prompt_format"] == "chat_template"
    assert tokenizer.decode(meta["prompt_token_ids"]) == "<user>12+7=<eos>\n<assistant>"
    sampled = meta["completion_token_ids"][0]
    assert usage["completion_tokens"] == len(sampled) >= 1
    assert usage["prompt_tokens"] == len(meta["prompt_token_ids"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
    assert len(logprobs) == len(sampled) and all(lp <= 0 for lp in logprobs)

    # the same prompt ids through the ZeroMQ side give the same greedy tokens: one engine behind both
    greedy = p.SamplingSpec(temperature=0.0, max_tokens=6)
    direct = zmq_call(address, p.Generate(prompt_token_ids=[meta["prompt_token_ids"]], sampling=greedy))
    assert direct.results[0].samples[0].token_ids == sampled

    finish = httpx.post(f"{url}/v1/episodes/single/finish", headers=AUTH, json={"reward": 0.5}, timeout=10.0)
    assert finish.status_code == 200 and finish.json()["turns"] == 1
    taken = zmq_call(address, p.TakeEpisodes(max_episodes=8)).episodes
    assert [e.id for e in taken] == ["single"] and taken[0].reward == 0.5
    turn = taken[0].turns[0]
    assert turn.prompt_token_ids == meta["prompt_token_ids"] and turn.token_ids == sampled
    assert turn.logprobs == pytest.approx(logprobs)
    assert zmq_call(address, p.TakeEpisodes(max_episodes=8)).episodes == []  # taken once


def test_two_requests_form_one_token_in_token_out_episode(endpoint, chat_model_dir):
    from transformers import AutoTokenizer

    url, address = endpoint
    first = [{"role": "system", "content": "Add."}, {"role": "user", "content": "2+3="}]
    one = chat(url, first, episode="two", max_tokens=4)
    answer = one["choices"][0]["message"]["content"]
    follow_up = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "+1="}]
    two = chat(url, follow_up, user="two", max_tokens=4)  # the `user` field names the episode too
    context = one["rlx"]["prompt_token_ids"] + one["rlx"]["completion_token_ids"][0]
    assert two["rlx"]["prompt_token_ids"][: len(context)] == context  # the model's own tokens, not re-tokenized
    assert httpx.post(f"{url}/v1/episodes/two/finish", headers=AUTH, json={"reward": 1.0}).status_code == 200

    (episode,) = zmq_call(address, p.TakeEpisodes(max_episodes=8)).episodes
    (row,) = episode_rows(episode)
    prompt, completion, logps, mask = row.row()
    observation = two["rlx"]["prompt_token_ids"][len(context) :]
    assert prompt == one["rlx"]["prompt_token_ids"]
    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    # the template's close of the answer (less the <eos> the model sampled itself, if it did), the new turn
    closing = "\n" if context[-1] == tokenizer.eos_token_id else "<eos>\n"
    assert tokenizer.decode(observation) == closing + "<user>+1=<eos>\n<assistant>"
    n1, n2 = len(one["rlx"]["completion_token_ids"][0]), len(two["rlx"]["completion_token_ids"][0])
    assert completion == context[len(prompt) :] + observation + two["rlx"]["completion_token_ids"][0]
    assert mask == [1.0] * n1 + [0.0] * len(observation) + [1.0] * n2
    assert len(logps) == len(completion) and all(lp == 0.0 for lp, m in zip(logps, mask, strict=True) if m == 0.0)
    sampled = [lp for lp, m in zip(logps, mask, strict=True) if m == 1.0]  # the engine's logprobs of the sampled tokens
    assert all(lp <= 0.0 for lp in sampled) and any(lp < 0.0 for lp in sampled)


def finish(url: str, episode: str, reward: float) -> None:
    reply = httpx.post(f"{url}/v1/episodes/{episode}/finish", headers=AUTH, json={"reward": reward}, timeout=10.0)
    assert reply.status_code == 200, reply.text


def test_n_in_the_first_request_opens_a_group_of_episodes(endpoint):
    url, address = endpoint
    first = [{"role": "user", "content": "2+3="}]
    forked = chat(url, first, episode="g", n=2, max_tokens=4, seed=5)
    assert forked["rlx"]["episode_ids"] == ["g.0", "g.1"] and len(forked["choices"]) == 2
    refused = httpx.post(
        f"{url}/v1/chat/completions",
        headers=dict(AUTH, **{"X-Episode-Id": "g.0"}),
        timeout=60.0,
        json={"messages": first, "n": 2},
    )
    assert refused.status_code == 400 and "allowed on a new episode id only" in refused.text
    answer = forked["choices"][0]["message"]["content"]
    follow = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "+1="}]
    two = chat(url, follow, episode="g.0", max_tokens=4)  # each sample goes on as its own episode
    context = forked["rlx"]["prompt_token_ids"] + forked["rlx"]["completion_token_ids"][0]
    assert two["rlx"]["prompt_token_ids"][: len(context)] == context
    finish(url, "g.0", 1.0)
    assert zmq_call(address, p.TakeEpisodes(max_episodes=8, group_size=2)).episodes == []  # half a group waits
    finish(url, "g.1", 0.0)
    taken = zmq_call(address, p.TakeEpisodes(max_episodes=8, group_size=2)).episodes
    assert [(e.id, e.group, e.reward, len(e.turns)) for e in taken] == [("g.0", "g", 1.0, 2), ("g.1", "g", 0.0, 1)]
    assert taken[1].turns[0].token_ids == forked["rlx"]["completion_token_ids"][1]

    # or the agent names each episode's group; an episode of no group is never taken as part of one
    for episode, group in (("x", "h"), ("lone", ""), ("y", "h")):
        headers = dict(AUTH, **{"X-Episode-Id": episode}, **({"X-Group-Id": group} if group else {}))
        reply = httpx.post(
            f"{url}/v1/chat/completions", headers=headers, timeout=60.0, json={"messages": first, "max_tokens": 2}
        )
        assert reply.status_code == 200, reply.text
        finish(url, episode, 0.5)
    grouped = zmq_call(address, p.TakeEpisodes(max_episodes=8, group_size=2)).episodes
    assert [(e.id, e.group) for e in grouped] == [("x", "h"), ("y", "h")]
    assert [e.id for e in zmq_call(address, p.TakeEpisodes(max_episodes=8)).episodes] == ["lone"]


def test_auth_and_request_errors_are_clear(endpoint):
    url, _ = endpoint
    body = {"messages": [{"role": "user", "content": "1+1="}], "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        reply = httpx.post(f"{url}/v1/chat/completions", headers=headers, json=body)
        assert reply.status_code == 401 and "Authorization: Bearer" in reply.json()["error"]["message"]
    reply = httpx.post(f"{url}/v1/episodes/nope/finish", headers=AUTH, json={"reward": 1.0})
    assert reply.status_code == 404 and "no open episode 'nope'" in reply.json()["error"]["message"]
    assert (
        httpx.post(
            f"{url}/v1/chat/completions", headers=dict(AUTH, **{"X-Episode-Id": "e"}), json=body, timeout=60.0
        ).status_code
        == 200
    )
    reply = httpx.post(
        f"{url}/v1/chat/completions", headers=dict(AUTH, **{"X-Episode-Id": "e"}), json=dict(body, n=2), timeout=60.0
    )  # n > 1 in the middle of an episode (branching) is left out
    assert reply.status_code == 400 and "send n=1" in reply.json()["error"]["message"]
    reply = httpx.post(
        f"{url}/v1/chat/completions", headers=dict(AUTH, **{"X-Episode-Id": "refused"}), json=dict(body, max_tokens=0)
    )
    assert reply.status_code == 400 and "max_tokens" in reply.json()["error"]["message"]
    reply = httpx.post(f"{url}/v1/episodes/refused/finish", headers=AUTH, json={"reward": 1.0})
    assert reply.status_code == 404  # a refused first request opened no episode


def test_a_client_that_hangs_up_mid_body_costs_one_log_line(endpoint, openai_work):
    url, _ = endpoint
    port = int(url.rsplit(":", 1)[1])
    for _ in range(2):
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000\r\nAuthorization: Bearer "
                + TOKEN.encode()
                + b'\r\n\r\n{"messages": [{"role": "user", "content": "hel'
            )
            time.sleep(0.3)  # the body is being read when the client goes
    response = httpx.get(f"{url}/v1/models", headers=AUTH, timeout=10.0)  # the server stays up
    assert response.status_code == 200
    deadline = time.time() + 10
    while time.time() < deadline and (openai_work / "serve.log").read_text().count("hung up") < 2:
        time.sleep(0.2)
    log = (openai_work / "serve.log").read_text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-4000:]
    lines = [line for line in log.splitlines() if "hung up" in line]
    assert len(lines) == 2 and "POST /v1/chat/completions" in lines[0], log[-4000:]


def test_a_body_over_the_limit_is_refused_unread_and_the_server_goes_on(endpoint):
    url, address = endpoint
    huge = {"messages": [{"role": "user", "content": "1+" * int(MAX_BODY_MB * 2**20)}], "max_tokens": 2}
    data = json.dumps(huge).encode()

    def chunked():  # no Content-Length: the limit holds on the stream itself
        for start in range(0, len(data), 65536):
            yield data[start : start + 65536]

    for content in (data, chunked()):
        reply = httpx.post(f"{url}/v1/chat/completions", headers=AUTH, content=content, timeout=60.0)
        assert reply.status_code == 413, reply.text
        assert reply.json()["error"]["message"] == (
            f"the request body is larger than rollout.openai_max_body_mb={MAX_BODY_MB:g} MiB; send a shorter "
            "conversation, or raise rollout.openai_max_body_mb on the rollout server"
        )
    assert chat(url, [{"role": "user", "content": "1+1="}], max_tokens=2)["choices"]
    assert zmq_call(address, p.Health()).weight_version >= 0


def test_off_loopback_endpoint_without_a_token_is_refused_before_start(tiny_model_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rlx.cli import app

    monkeypatch.delenv("RLX_ROLLOUT_AUTH_TOKEN", raising=False)
    config = write_config(tmp_path / "c.yaml", tiny_model_dir, rollout={"backend": "hf", "openai_host": "0.0.0.0"})
    result = CliRunner().invoke(
        app, ["rollout-serve", str(config), "--address", f"ipc://{tmp_path}/s.sock", "--openai-port", str(free_port())]
    )
    assert result.exit_code == 2, result.output
    assert "binding the OpenAI endpoint to 0.0.0.0 needs an auth token" in result.output


def test_the_server_log_names_the_endpoint_url(endpoint, openai_work):
    url, _ = endpoint
    port = url.rsplit(":", 1)[1]
    assert f"OpenAI-compatible endpoint at http://0.0.0.0:{port}/v1" in (openai_work / "serve.log").read_text()


@pytest.mark.slow
def test_train_on_episodes_an_external_client_finished(endpoint, chat_model_dir, tmp_path):
    """Last in this module: the run syncs its weights into the shared server. The run starts first and says on
    its console that it waits for the agent's episodes; then the agent drives them."""
    url, address = endpoint
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path / "run.yaml",
        chat_model_dir,
        task={"name": "external"},
        rollout={"backend": "hf", "n": 1, "max_tokens": 4, "servers": [address], "num_servers": 0},
        algorithm={"advantage": "reinforce_pp"},
        trainer={"prompts_per_step": 2, "total_steps": 1, "micro_batch_size": 2, "output_dir": str(run_dir)},
    )
    log = tmp_path / "train.log"
    proc = start_rlx(["train", str(config)], log, env={"RLX_ROLLOUT_AUTH_TOKEN": TOKEN})
    try:
        deadline = time.monotonic() + 240
        while "waiting for the agent: 0 of 2 episodes finished" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        assert "POST .../v1/episodes/ID/finish" in " ".join(log.read_text().split())
        for episode, reward in (("a", 1.0), ("b", 0.0)):
            first = [{"role": "user", "content": "3+4="}]
            one = chat(url, first, episode=episode, max_tokens=4)
            follow = first + [
                {"role": "assistant", "content": one["choices"][0]["message"]["content"]},
                {"role": "user", "content": "+2="},
            ]
            chat(url, follow, episode=episode, max_tokens=4)
            finish = httpx.post(f"{url}/v1/episodes/{episode}/finish", headers=AUTH, json={"reward": reward})
            assert finish.status_code == 200
        assert proc.wait(300) == 0, log.read_text()[-4000:]
    finally:
        stop_group(proc)
    (step,) = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if m.get("step") == 1]
    assert step["episodes"] == 2 and step["episode_turns_mean"] == 2 and step["reward_mean"] == 0.5
    assert step["episode_rows"] == 2 and step["grad_norm"] > 0
    # the weight sync reached the server: the agent's next request is answered by the trained weights
    after = chat(url, [{"role": "user", "content": "3+4="}], max_tokens=2)
    assert after["rlx"]["weight_version"] >= 1


def test_external_task_needs_groups_or_a_groupless_advantage(tiny_model_dir, tmp_path):
    from rlx.config import load_config
    from rlx.config.errors import ConfigError
    from rlx.orchestrator.external import check_config

    config = write_config(
        tmp_path / "run.yaml", tiny_model_dir, task={"name": "external"}, rollout={"n": 1, "openai_port": 8000}
    )
    with pytest.raises(ConfigError, match="set algorithm.advantage=reinforce_pp .* or rollout.n to the group size"):
        check_config(load_config(str(config), ["algorithm.advantage=grpo"]))
    check_config(load_config(str(config), ["algorithm.advantage=reinforce_pp"]))
    check_config(
        load_config(str(config), ["rollout.n=4", "algorithm.advantage=grpo", "trainer.mode=fully_async"])
    )  # groups of 4, as the agent asks for them
    launched = load_config(str(config), ["rollout.openai_port=0", "algorithm.advantage=reinforce_pp"])
    with pytest.raises(ConfigError, match="set rollout.openai_port"):
        check_config(launched)


def test_a_prompt_is_tokenized_while_the_server_goes_on_answering(chat_model_dir):
    """In process, with a real hf backend: rendering and tokenizing a conversation (seconds for a long one) must
    leave the event loop free. The chat format here waits, inside its tokenization, for the server to answer a
    Health request on the loop; were it tokenizing on the loop itself, that wait could never end."""
    from transformers import AutoTokenizer

    from rlx.config.model import ModelConfig
    from rlx.config.rollout import RolloutConfig
    from rlx.config.schema import RunConfig
    from rlx.rollout.backends.base import make_backend
    from rlx.rollout.openai_http import OpenAIEndpoint
    from rlx.rollout.server import RolloutServer

    class WaitsForTheLoop:
        def __init__(self, chat, server, loop):
            self.chat, self.server, self.loop, self.answered = chat, server, loop, []

        def __getattr__(self, name):
            return getattr(self.chat, name)

        def prompt_ids(self, messages, tools=None):
            health = p.Request(id=7, body=p.Health(), deadline=time.time() + 60)
            reply = asyncio.run_coroutine_threadsafe(self.server.answer(health), self.loop).result(timeout=30)
            self.answered.append(reply.ok)
            return self.chat.prompt_ids(messages, tools)

    async def scenario():
        cfg = RunConfig(model=ModelConfig(path=str(chat_model_dir)), rollout=RolloutConfig(backend="hf"))
        backend = make_backend(rollout_role(cfg))
        await backend.start()
        server = RolloutServer(backend, "ipc://unused")
        endpoint = OpenAIEndpoint(
            server, AutoTokenizer.from_pretrained(chat_model_dir), p.SamplingSpec(max_tokens=2), "tiny"
        )
        endpoint.chat = WaitsForTheLoop(endpoint.chat, server, asyncio.get_running_loop())
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=endpoint.app()), base_url="http://rlx"
            ) as client:
                reply = await client.post(
                    "/v1/chat/completions", timeout=60.0, json={"messages": [{"role": "user", "content": "1+1="}]}
                )
        finally:
            await backend.close()
        return reply, endpoint.chat.answered

    reply, answered = asyncio.run(scenario())
    assert reply.status_code == 200, reply.text
    assert answered == [True]


@pytest.mark.slow
def test_fully_async_grpo_trains_on_groups_an_external_client_asked_for(endpoint, chat_model_dir, tmp_path):
    """After the single-episode run: the weights it synced make the servers' version 1 or more."""
    url, address = endpoint
    version = chat(url, [{"role": "user", "content": "1+1="}], max_tokens=1)["rlx"]["weight_version"]
    for group in ("p", "q"):
        forked = chat(url, [{"role": "user", "content": "3+4="}], episode=group, n=2, max_tokens=4, seed=1)
        for i, episode in enumerate(forked["rlx"]["episode_ids"]):
            finish(url, episode, float(i))
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path / "run.yaml",
        chat_model_dir,
        task={"name": "external"},
        rollout={"backend": "hf", "n": 2, "max_tokens": 4, "servers": [address], "num_servers": 0},
        algorithm={"advantage": "grpo"},
        trainer={
            "mode": "fully_async",
            "max_staleness": 1,
            "prompts_per_step": 2,
            "total_steps": 1,
            "micro_batch_size": 4,
            "output_dir": str(run_dir),
        },
    )
    log = tmp_path / "train.log"
    proc = start_rlx(["train", str(config)], log, env={"RLX_ROLLOUT_AUTH_TOKEN": TOKEN})
    try:
        assert proc.wait(300) == 0, log.read_text()[-4000:]
    finally:
        stop_group(proc)
    (step,) = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if m.get("step") == 1]
    assert step["episodes"] == 4 and step["episode_rows"] == 4 and step["reward_mean"] == 0.5
    assert step["groups_dropped_split"] == 0 and step["samples_dropped_stale"] == 0
    assert step["grad_norm"] > 0  # rewards 0 and 1 in each group: a signal
    # the episodes were sampled by the weights an earlier run synced (version >= 1); this run starts at 0
    assert version >= 1 and step["staleness_max"] == 0
