"""Load a run config: YAML file + ``key=value`` overrides -> validated ``RunConfig``.

Composition goes through Hydra's compose API: the schema is registered in ConfigStore as
``rlx_schema`` and put first in the defaults list, the user's file (and any config groups
it names, looked up beside it) after it, then the overrides. Keys are checked against the
schema before Hydra runs so that a misspelling gets a "did you mean" instead of a Hydra
trace. The result is converted to real dataclasses, so each ``__post_init__`` validates.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import (
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
)

from rlx.config.errors import ConfigError
from rlx.config.redact import REDACTED, SECRET_FIELDS
from rlx.config.schema import RunConfig
from rlx.config.yaml_file import read_yaml

SCHEMA_NAME = "rlx_schema"
# Names users bring from other RL frameworks (TRL, verl, OpenRLHF) -> the rlx key.
ALIASES = {
    "learning_rate": "trainer.lr",
    "lr_warmup_steps": "trainer.warmup_steps",
    "max_steps": "trainer.total_steps",
    "num_steps": "trainer.total_steps",
    "total_training_steps": "trainer.total_steps",
    "grad_clip": "trainer.max_grad_norm",
    "clip_grad": "trainer.max_grad_norm",
    "ppo_epochs": "trainer.epochs_per_step",
    "ppo_micro_batch_size": "trainer.micro_batch_size",
    "train_batch_size": "trainer.prompts_per_step",
    "batch_size": "trainer.prompts_per_step",
    "num_generations": "rollout.n",
    "group_size": "rollout.n",
    "n_samples_per_prompt": "rollout.n",
    "max_new_tokens": "rollout.max_tokens",
    "max_response_length": "rollout.max_tokens",
    "max_completion_length": "rollout.max_tokens",
    "beta": "algorithm.kl_coef",
    "kl_loss_coef": "algorithm.kl_coef",
    "clip_ratio": "algorithm.clip_low",
    "clip_ratio_high": "algorithm.clip_high",
    "epsilon": "algorithm.clip_low",
    "epsilon_high": "algorithm.clip_high",
    "entropy_coeff": "algorithm.entropy_coef",
    "model_name_or_path": "model.path",
    "model_path": "model.path",
}
_USER_NAME = "rlx_user_config"


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Compose, check and validate a run config. Raises ``ConfigError`` naming the fix."""
    path = Path(path)
    raw = read_yaml(path)
    user_defaults = raw.pop("defaults", [])
    if not isinstance(user_defaults, list):
        raise ConfigError(
            f"defaults in {path} must be a list of config files beside it (one '- name' per "
            f"line), got {user_defaults!r}"
        )
    check_keys(raw, RunConfig, prefix="", source=str(path))
    override_keys = _override_keys(overrides)
    for key in override_keys:
        check_key_path(key, source="overrides")
    composed = _compose(path, raw, user_defaults, list(overrides))
    return to_run_config(composed)


def check_keys(data: dict[str, Any], schema: type, prefix: str, source: str) -> None:
    """Raise on the first key of ``data`` that the dataclass ``schema`` does not have."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(_unknown_key_message(full, schema, source))
        sub = _dataclass_type(fields[key].type)
        if sub is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"{full} in {source} must be a section (a mapping of keys), got {value!r}")
            check_keys(value, sub, prefix=f"{full}.", source=source)


def check_key_path(dotted: str, source: str) -> None:
    schema: type | None = RunConfig
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(schema)} if schema else {}
        if part not in fields:
            raise ConfigError(_unknown_key_message(".".join(parts[: depth + 1]), schema or RunConfig, source))
        schema = _dataclass_type(fields[part].type)


def to_run_config(composed: Any) -> RunConfig:
    structured = OmegaConf.merge(OmegaConf.structured(RunConfig), composed)
    try:
        return OmegaConf.to_object(structured)
    except MissingMandatoryValue as exc:
        key = exc.full_key
        raise ConfigError(f"{key} is required but not set; add it to the config or pass {key}=VALUE") from None
    except OmegaConfBaseException as exc:
        raise ConfigError(_omegaconf_message(exc)) from None


def all_key_paths(schema: type = RunConfig, prefix: str = "") -> list[str]:
    paths = []
    for f in dataclasses.fields(schema):
        sub = _dataclass_type(f.type)
        if sub is None:
            paths.append(prefix + f.name)
        else:
            paths.extend(all_key_paths(sub, prefix + f.name + "."))
    return paths


def _compose(path: Path, raw: dict, user_defaults: list, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException

    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=RunConfig)
    store.store(name=_USER_NAME, node={"defaults": [SCHEMA_NAME, *user_defaults, "_self_"], **raw})
    try:
        with initialize_config_dir(config_dir=str(path.parent.resolve()), version_base=None, job_name="rlx"):
            return compose(config_name=_USER_NAME, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        value_error = _omegaconf_cause(exc)
        if value_error is not None:
            raise ConfigError(_omegaconf_message(value_error)) from None
        first_line = str(exc).strip().split("\n")[0]
        raise ConfigError(
            f"cannot compose {path}: {first_line}; config groups in 'defaults:' are YAML files "
            f"looked up beside {path.name}"
        ) from None


def _override_keys(overrides: Iterable[str]) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    overrides = list(overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as exc:
        raise ConfigError(f"malformed override: {exc.message}; write overrides as section.key=value") from None
    return [p.key_or_group for p in parsed]


def _unknown_key_message(full_key: str, schema: type, source: str) -> str:
    leaf = full_key.rsplit(".", 1)[-1]
    section = full_key.rsplit(".", 1)[0] + "." if "." in full_key else ""
    local = [f.name for f in dataclasses.fields(schema)]
    close = difflib.get_close_matches(leaf, local, n=1, cutoff=0.6)
    if leaf in ALIASES:
        hint = f"did you mean '{ALIASES[leaf]}'?"
    elif close:
        hint = f"did you mean '{section}{close[0]}'?"
    else:
        elsewhere = [p for p in all_key_paths() if p.rsplit(".", 1)[-1] == leaf]
        elsewhere = elsewhere or difflib.get_close_matches(full_key, all_key_paths(), n=1, cutoff=0.6)
        if elsewhere:
            hint = f"did you mean '{elsewhere[0]}'?"
        else:
            nearest = difflib.get_close_matches(leaf, local, n=3, cutoff=0.0)
            hint = f"nearest valid keys in {section.rstrip('.') or 'the top level'}: " + ", ".join(
                section + n for n in nearest
            )
    return f"unknown config key '{full_key}' (in {source}); {hint} (`rlx config show` lists every key)"


def _omegaconf_cause(exc: BaseException) -> OmegaConfBaseException | None:
    """The OmegaConf error that names a key, wherever Hydra put it in the exception chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OmegaConfBaseException) and getattr(exc, "full_key", None):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _omegaconf_message(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None) or "?"
    secret = key.rsplit(".", 1)[-1] in SECRET_FIELDS  # the message must not echo a token
    msg = "the value (not shown: a secret) has the wrong type" if secret else str(exc).split("\n")[0]
    if isinstance(exc, InterpolationResolutionError):
        return f"bad value for {key}: {msg}; interpolate only keys that exist, e.g. ${{run_name}}"
    expected = _field_type(key)
    if expected is None or isinstance(exc, MissingMandatoryValue):
        return f"bad value for {key}: {msg}; set {key} to a value of the type the schema allows (`rlx config show`)"
    field, words = expected
    example = _default_text(field)
    example = f", e.g. {key}={example}" if example else ""
    value = REDACTED if secret else repr(getattr(exc, "value", None))
    return f"{key}={value} is not {words}; set {key} to {words}{example}"


_TYPE_WORDS = {
    "float": "a number",
    "int": "a whole number",
    "bool": "true or false",
    "str": "a string",
    "list[float]": "a list of numbers",
    "list[str]": "a list of strings",
}


def _field_type(dotted: str) -> tuple[dataclasses.Field, str] | None:
    """The schema field that ``dotted`` names and its type in words, or None if it names no leaf field."""
    schema: type | None = RunConfig
    found = None
    for part in dotted.split("."):
        found = {f.name: f for f in dataclasses.fields(schema)}.get(part) if schema else None
        if found is None:
            return None
        schema = _dataclass_type(found.type)
    if schema is not None:
        return None
    return found, _TYPE_WORDS.get(str(found.type), f"of type {found.type}")


def _default_text(field: dataclasses.Field) -> str:
    """The field's default as it would be written in an override; empty when it has none."""
    if field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    elif field.default not in (dataclasses.MISSING, "???", ""):
        default = field.default
    else:
        return ""
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, list):
        return "[" + ", ".join(map(str, default)) + "]"
    return str(default)


def _dataclass_type(tp: Any) -> type | None:
    if isinstance(tp, str):
        tp = _section_classes().get(tp)
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


@functools.cache
def _section_classes() -> dict[str, type]:
    """Every section's dataclass by name, found by resolving the annotations from ``RunConfig`` down (each
    section's module names the sections it holds)."""
    found, todo = {}, [RunConfig]
    while todo:
        for tp in typing.get_type_hints(todo.pop()).values():
            if dataclasses.is_dataclass(tp) and tp.__name__ not in found:
                found[tp.__name__] = tp
                todo.append(tp)
    return found
