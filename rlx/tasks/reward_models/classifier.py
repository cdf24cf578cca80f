"""A sequence-classifier reward: a local ``AutoModelForSequenceClassification`` directory scores prompt +
completion in batches, in the controller process (on the CPU; a GPU reward model is left out).

``label=-1`` takes the logit of a ``num_labels=1`` model (a Bradley-Terry reward model); ``label=k`` the
softmax probability of label k. The classifier reads text with its own tokenizer, saved beside it, so the
policy's tokenizer does not matter; the check that does is that the tokenizer's ids fit the classifier's
embedding. Sequences are padded on the right and cut on the left (the end of a completion is kept).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from rlx.config.errors import ConfigError
from rlx.formats.hf_dir import has_tokenizer
from rlx.tasks.reward_models import Scored

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


class Classifier:
    def __init__(self, rm) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.rm = rm
        self.tokenizer = AutoTokenizer.from_pretrained(rm.path)
        self.tokenizer.padding_side, self.tokenizer.truncation_side = "right", "left"
        self.model = AutoModelForSequenceClassification.from_pretrained(rm.path, dtype=torch.float32).eval()
        if self.model.config.pad_token_id is None:  # batches need it to find each row's last token
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self._lock = asyncio.Lock()

    def score_texts(self, texts: list[str]) -> list[float]:
        import torch

        scores: list[float] = []
        size = self.rm.batch_size
        with torch.inference_mode():
            for i in range(0, len(texts), size):
                enc = self.tokenizer(
                    texts[i : i + size],
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=self.rm.max_length,
                    add_special_tokens=False,
                )
                logits = self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits.float()
                values = logits[:, 0] if self.rm.label < 0 else logits.softmax(-1)[:, self.rm.label]
                scores += values.tolist()
        return scores

    async def score(self, questions: list[str], responses: list[str], answers: list[str]) -> Scored:
        async with self._lock:  # one forward at a time: the model is not shared across threads
            scores = await asyncio.to_thread(
                self.score_texts, [q + r for q, r in zip(questions, responses, strict=True)]
            )
        return Scored(scores)


def check_classifier(rm) -> None:
    """Pre-flight, without loading the weights: a classifier config, weights, a tokenizer that fits it, a label
    the head has."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto import modeling_auto

    where = f"task.reward_model.path={rm.path!r}"
    fix = "save one with AutoModelForSequenceClassification.save_pretrained(DIR) and tokenizer.save_pretrained(DIR)"
    path = Path(rm.path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"{where} has no config.json; {fix}")
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - any unreadable config is the same user error
        raise ConfigError(f"{where}: config.json does not load ({type(exc).__name__}: {exc}); {fix}") from None
    if config.model_type not in modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        raise ConfigError(
            f"{where}: model type {config.model_type!r} has no sequence-classification head in "
            "transformers; use a *ForSequenceClassification model"
        )
    if not any((path / name).is_file() for name in WEIGHT_FILES) and not list(path.glob("*.safetensors")):
        raise ConfigError(f"{where} has no weights (model.safetensors); {fix}")
    if rm.label < 0 and config.num_labels != 1:
        raise ConfigError(
            f"{where} has num_labels={config.num_labels}; task.reward_model.label=-1 takes the logit "
            f"of a num_labels=1 model: set task.reward_model.label to the label (0..{config.num_labels - 1})"
            " whose probability is the reward"
        )
    if rm.label >= config.num_labels:
        raise ConfigError(
            f"task.reward_model.label={rm.label} but {rm.path} has num_labels={config.num_labels}; "
            f"set a label in 0..{config.num_labels - 1}"
        )
    tokenizer_fix = "save the classifier's tokenizer into the same directory (tokenizer.save_pretrained(DIR))"
    if not has_tokenizer(path):
        raise ConfigError(f"{where} has no tokenizer files; {tokenizer_fix}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - a missing or broken tokenizer is the same user error
        raise ConfigError(
            f"{where}: no tokenizer loads from it ({type(exc).__name__}: {exc}); {tokenizer_fix}"
        ) from None
    vocab = getattr(config.get_text_config(), "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        raise ConfigError(
            f"{where}: its tokenizer has {len(tokenizer)} tokens but the classifier's embedding only "
            f"{vocab}; save the tokenizer the classifier was trained with into {rm.path}"
        )
    if tokenizer.pad_token_id is None and config.pad_token_id is None:
        raise ConfigError(
            f"{where}: neither the tokenizer nor config.json has a pad token, which batches need; set "
            "tokenizer.pad_token (e.g. to the eos token) and save it again"
        )
