"""How an episode's turns become token ids: the first prompt, then what follows each policy turn.

``PlainFraming`` is for models without a chat template (rlx's tiny character models): the prompt
text and each observation's text are tokenised as they are.

``ChatFraming`` lets the model's chat template frame every turn. The first prompt is the task's
messages rendered with the tool schemas and the generation prompt. After a policy turn, the ids
appended are the template's own text for: the end of the assistant turn (``<|im_end|>\\n`` in
ChatML; an end token the policy sampled itself is not repeated), the environment's messages (each
tool result as a ``tool`` message) and the header of the next assistant turn. That text is the
difference between a fixed two-message conversation rendered with and without the new messages,
so earlier turns are never rendered or tokenised again and the episode keeps exactly the ids the
engine sampled. Where the template renders each message independently of its neighbours (ChatML
models such as SmolLM2 and Qwen2.5, Llama 3), the episode's ids are the template's rendering of the
whole conversation, the policy's turns as it sampled them (a test checks it on SmolLM2).

A template that ignores ``tools`` (SmolLM2's) gets the schemas in the system message, in Hermes
form, with how to call them. A prompt that is already rendered (it ends with the template's
generation prompt, as a gsm8k task's prompts do with ``task.chat_template``) is tokenised as it is.
Left out: templates that rewrite earlier turns when a new one comes (e.g. dropping the reasoning
of earlier assistant turns); the episode keeps what was sampled.
"""

from __future__ import annotations

import json

from rlx.formats.chat import Messages

PROBE_ANSWER = "rlx-probe-answer"
PROBE = [{"role": "user", "content": "rlx-probe-question"}, {"role": "assistant", "content": PROBE_ANSWER}]


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def plain_text(messages: Messages) -> str:
    return "".join(str(m.get("content") or "") for m in messages)


class PlainFraming:
    """Prompt and observations as plain text; ``tools`` are described by the task's own prompt."""

    kind = "plain"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def prompt_ids(self, prompt: str | Messages) -> list[int]:
        return _encode(self.tokenizer, prompt if isinstance(prompt, str) else plain_text(prompt))

    def observation_ids(self, turn_ids: list[int], observation: str, messages: Messages) -> list[int]:
        return _encode(self.tokenizer, observation)


class ChatFraming:
    """Turns framed by the tokenizer's chat template (see the module docstring)."""

    kind = "chat_template"

    def __init__(self, tokenizer, system_prompt: str = "", tools: list[dict] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise ValueError(f"the tokenizer of {name!r} has no chat template; set task.chat_template=off")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.tools = tools or None
        self.tools_in_system = bool(tools) and not self._renders_tools()
        head = self._render(PROBE, generation_prompt=False)
        self.closing = head[head.rindex(PROBE_ANSWER) + len(PROBE_ANSWER) :]
        """What the template writes after an assistant message's content (e.g. '<|im_end|>\\n')."""
        asked = self._render(PROBE[:1], generation_prompt=True)
        self.generation_prompt = asked[len(self._render(PROBE[:1], generation_prompt=False)) :]
        """The header of an assistant turn (e.g. '<|im_start|>assistant\\n')."""

    def _render(self, messages: Messages, generation_prompt: bool, tools: list[dict] | None = None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _renders_tools(self) -> bool:
        return self._render(PROBE[:1], True, self.tools) != self._render(PROBE[:1], True)

    def messages(self, prompt: str | Messages) -> Messages:
        """The first prompt's messages: the system message (with the tools when the template ignores them) first."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        system = "\n\n".join(part for part in (self.tools_text(), self.system_prompt) if part)
        if not system:
            return messages
        if messages and messages[0].get("role") == "system":
            return [{"role": "system", "content": f"{system}\n\n{messages[0].get('content') or ''}"}, *messages[1:]]
        return [{"role": "system", "content": system}, *messages]

    def tools_text(self) -> str:
        """The tools in Hermes form, for a template that does not render ``tools`` itself ('' otherwise)."""
        if not self.tools_in_system:
            return ""
        lines = "\n".join(json.dumps(t.get("function", t)) for t in self.tools)
        return (
            f"You can call these tools:\n<tools>\n{lines}\n</tools>\nTo call one, write "
            '<tool_call>{"name": NAME, "arguments": {...}}</tool_call>; its result comes back in the next message.'
        )

    def render(self, messages: Messages, generation_prompt: bool = True) -> str:
        """The template's text of a conversation that starts with the first prompt's messages."""
        return self._render(messages, generation_prompt, None if self.tools_in_system else self.tools)

    def prompt_ids(self, prompt: str | Messages) -> list[int]:
        if isinstance(prompt, str) and prompt.endswith(self.generation_prompt):
            return _encode(self.tokenizer, prompt)  # already rendered by the task
        return _encode(self.tokenizer, self.render(self.messages(prompt)))

    def observation_ids(self, turn_ids: list[int], observation: str, messages: Messages) -> list[int]:
        """End of the assistant turn + ``messages`` (else ``observation`` as a user message) + the next header."""
        messages = messages or [{"role": "user", "content": observation}]
        head = self._render(PROBE, generation_prompt=False)
        whole = self._render(PROBE + list(messages), generation_prompt=True)
        if not whole.startswith(head):
            raise ValueError(
                "the chat template renders a conversation differently once messages follow it, so "
                "turns cannot be appended as token ids; set task.chat_template=off"
            )
        ids = _encode(self.tokenizer, self.closing + whole[len(head) :])
        end = ids[0] if ids else None
        if turn_ids and end == turn_ids[-1] and end in self.tokenizer.all_special_ids:
            ids = ids[1:]  # the policy sampled the end of its turn itself
        return ids


def make_framing(tokenizer, chat_template: str, system_prompt: str = "", tools: list[dict] | None = None):
    """``ChatFraming`` when ``chat_template`` (task.chat_template) is on, or auto and the tokenizer has a template."""
    if chat_template == "off" or (chat_template == "auto" and not getattr(tokenizer, "chat_template", None)):
        return PlainFraming(tokenizer)
    return ChatFraming(tokenizer, system_prompt, tools)
