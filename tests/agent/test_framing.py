"""Framing turns as token ids: with SmolLM2's chat template (tools described in the system message) and a
Qwen2.5-style one (tools rendered by the template, consecutive tool results in one user turn), appending
each turn's framing to the sampled ids gives the template's rendering of the whole conversation."""

from __future__ import annotations

import json

import pytest

from rlx.agent.framing import ChatFraming, PlainFraming, make_framing
from rlx.agent.tools import BUILTIN, tool_schemas
from rlx.convert.gguf_import import SMOLLM2_INSTALL, smollm2_gguf

GGUF = smollm2_gguf()
pytestmark = pytest.mark.skipif(GGUF is None, reason=f"the SmolLM2 GGUF file is not installed ({SMOLLM2_INSTALL})")
TOOLS = tool_schemas({"calc": BUILTIN["calc"], "python": BUILTIN["python"]})

QWEN25_STYLE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] "
    "}}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}{{- '\\n\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("gguf", reason="transformers reads GGUF files with the gguf package (pip install gguf)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def call(expression):
    return f"<tool_call>{json.dumps({'name': 'calc', 'arguments': {'expression': expression}})}</tool_call>"


def episode_ids(framing, tokenizer, prompt, turns):
    """The ids an episode holds: the first prompt, then each turn's sampled ids and its framed reply."""
    ids = framing.prompt_ids(prompt)
    for sampled, replies in turns:
        ids += sampled
        if replies:
            ids += framing.observation_ids(sampled, "", [{"role": "tool", "content": r} for r in replies])
    return ids


def conversation(framing, prompt, turns, tokenizer):
    messages = framing.messages(prompt)
    for sampled, replies in turns:
        messages += [{"role": "assistant", "content": tokenizer.decode(sampled, skip_special_tokens=True)}]
        messages += [{"role": "tool", "content": r} for r in replies]
    return messages


@pytest.mark.parametrize("template", ["smollm2", "qwen25_style"])
def test_framed_turns_are_the_templates_rendering_of_the_conversation(tokenizer, template):
    if template == "qwen25_style":
        tokenizer = tokenizer.__class__.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)
        tokenizer.chat_template = QWEN25_STYLE
    framing = ChatFraming(tokenizer, "Answer with the number only.", TOOLS)
    assert framing.tools_in_system == (template == "smollm2")
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # turn 1 calls twice and ends with its end token; turn 2 is cut by max_tokens (no end token); turn 3 ends
    turns = [
        (encode(tokenizer, call("47*38") + call("1+1")) + [end], ["1786", "2"]),
        (encode(tokenizer, call("1786+0")), ["1786"]),
        (encode(tokenizer, "1786") + [end], []),
    ]
    prompt = [{"role": "user", "content": "What is 47*38?"}]
    ids = episode_ids(framing, tokenizer, prompt, turns)
    rendered = encode(tokenizer, framing.render(conversation(framing, prompt, turns, tokenizer), False))
    assert ids == rendered[: len(ids)] and tokenizer.decode(rendered[len(ids) :]) == "\n"
    text = tokenizer.decode(ids)
    assert '"name": "python"' in text and "Answer with the number only." in text
    if template == "qwen25_style":  # the two results of turn 1 share one user turn, as the template groups them
        assert (
            "<|im_start|>user\n<tool_response>\n1786\n</tool_response>\n<tool_response>\n2\n</tool_response>"
            "<|im_end|>" in text
        )
    else:
        assert text.count("<|im_start|>tool\n") == 3 and "<tools>" in text
    # the end token the policy did not sample is the framing's (context, never trained on)
    cut = framing.observation_ids(turns[1][0], "", [{"role": "tool", "content": "1786"}])
    assert cut[0] == end and framing.observation_ids(turns[0][0], "", [{"role": "tool", "content": "x"}])[0] != end


def test_a_rendered_prompt_is_kept_and_an_observation_without_messages_is_a_user_turn(tokenizer):
    framing = ChatFraming(tokenizer)
    rendered = framing.render([{"role": "user", "content": "hi"}])
    assert framing.prompt_ids(rendered) == encode(tokenizer, rendered)
    assert framing.prompt_ids("hi") == encode(tokenizer, rendered)
    reply = framing.observation_ids([5, 6], "try again", [])
    assert tokenizer.decode(reply) == "<|im_end|>\n<|im_start|>user\ntry again<|im_end|>\n<|im_start|>assistant\n"


def test_framing_follows_task_chat_template(tokenizer, tiny_model_dir):
    from transformers import AutoTokenizer

    assert isinstance(make_framing(tokenizer, "off"), PlainFraming)
    assert isinstance(make_framing(tokenizer, "auto"), ChatFraming)
    tiny = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert isinstance(make_framing(tiny, "auto"), PlainFraming)
    with pytest.raises(ValueError, match="has no chat template; set task.chat_template=off"):
        make_framing(tiny, "on")
