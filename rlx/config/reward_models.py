"""``task.reward_model``: a learned reward scored over a whole step's samples (``rlx.tasks.reward_models``).

It sits under ``task`` because it replaces (or mixes into) the task's reward, for single-turn samples and
multi-turn episodes alike. It imports nothing heavy (the schema loads it); everything that needs a file or a
server is checked by ``rlx.tasks.reward_models.check_reward_model`` in pre-flight.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from rlx.config.checks import check_choice, check_range
from rlx.config.errors import ConfigError

KIND_CHOICES = ("none", "judge", "classifier")
PARSE_CHOICES = ("number", "yes_no")
TEMPLATE_FIELDS = ("question", "response", "answer")
DEFAULT_TEMPLATE = "Rate the response to the question from 0 to 1.\nQuestion: {question}\nResponse: {response}\nScore:"


@dataclass
class RewardModelConfig:
    kind: str = "none"
    """none, judge (a generative judge served by `rlx rollout-serve`) or classifier (a local sequence classifier)."""
    weight: float = 1.0
    """reward = weight * model score + (1 - weight) * task reward; 1 = the model's score alone."""
    server: str = ""
    """judge: address (tcp://host:port or ipc://path) of a running `rlx rollout-serve` of the judge model."""
    template: str = DEFAULT_TEMPLATE
    """judge: prompt text; {question} = the task's prompt, {response} = the sample (an episode's whole
    transcript after the prompt), {answer} = the ground truth. Write {{ and }} for literal braces."""
    parse: str = "number"
    """judge: number (the first match of score_pattern in the reply) or yes_no (the first 'yes' -> 1, 'no' -> 0)."""
    score_pattern: str = r"-?\d+(?:\.\d+)?"
    """judge, parse=number: regex whose first match (its first group, if it has one) is the score."""
    max_tokens: int = 16
    """judge: tokens of the judge's greedy reply."""
    timeout_s: float = 120.0
    """judge: deadline of the step's one batched Generate request; past it the step fails naming the server."""
    path: str = ""
    """classifier: Hugging Face directory of an AutoModelForSequenceClassification (with its tokenizer), or a Hub id
    ORG/NAME[@REVISION] that `rlx train` resolves to its snapshot in huggingface_hub's cache."""
    label: int = -1
    """classifier: -1 = the logit of a num_labels=1 model; k >= 0 = the softmax probability of label k."""
    batch_size: int = 16
    """classifier: sequences per forward pass."""
    max_length: int = 1024
    """classifier: prompt + completion are cut to this many tokens (keeping the end)."""

    def __post_init__(self) -> None:
        check_choice("task.reward_model.kind", self.kind, KIND_CHOICES)
        check_choice("task.reward_model.parse", self.parse, PARSE_CHOICES)
        check_range("task.reward_model.weight", self.weight, 0.0, 1.0)
        check_range("task.reward_model.max_tokens", self.max_tokens, 1)
        check_range("task.reward_model.timeout_s", self.timeout_s, 0.1)
        check_range("task.reward_model.label", self.label, -1)
        check_range("task.reward_model.batch_size", self.batch_size, 1)
        check_range("task.reward_model.max_length", self.max_length, 2)
        if self.kind == "judge":
            check_template(self.template)
            check_pattern(self.score_pattern)
            check_address(self.server)
        if self.kind == "classifier" and not self.path:
            raise ConfigError(
                "task.reward_model.kind=classifier needs task.reward_model.path; set it to a local "
                "directory saved by AutoModelForSequenceClassification.save_pretrained"
            )


def check_template(template: str) -> None:
    """Only {question}, {response} and {answer} may appear, and {response} must."""
    try:
        names = [name for _, name, spec, conv in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ConfigError(
            f"task.reward_model.template is not a valid template ({exc}); write {{{{ and }}}} for literal braces"
        ) from None
    unknown = [n for n in names if n not in TEMPLATE_FIELDS]
    if unknown:
        raise ConfigError(
            f"task.reward_model.template has an unknown placeholder {{{unknown[0]}}}; use "
            f"{', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)} (write {{{{ and }}}} for literal braces)"
        )
    if "response" not in names:
        raise ConfigError("task.reward_model.template has no {response}; the judge must see the sample it scores")


def check_pattern(pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"task.reward_model.score_pattern={pattern!r} is not a regex ({exc})") from None


def check_address(address: str) -> None:
    """A ZeroMQ address of `rlx rollout-serve`: tcp://host:port or ipc://path."""
    ok = False
    if address.startswith("ipc://"):
        ok = len(address) > len("ipc://")
    elif address.startswith("tcp://"):
        host, _, port = address[len("tcp://") :].rpartition(":")
        ok = bool(host) and port.isdigit() and 0 < int(port) < 65536
    if not ok:
        raise ConfigError(
            f"task.reward_model.server={address!r} is not a rollout server address; start the judge "
            "with `rlx rollout-serve JUDGE.yaml --address tcp://127.0.0.1:PORT` and set "
            "task.reward_model.server to that address (tcp://host:port or ipc://path)"
        )
