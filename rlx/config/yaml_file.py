"""Reading a YAML config file: bounded in size, UTF-8, strict about keys given twice, and every failure a
``ConfigError`` naming the file, the line and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlx.config.errors import ConfigError

MAX_CONFIG_BYTES = 16 << 20


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error instead of the later one silently
    winning."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *anchor``, merged by the base class
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one section; keep one of them", key_node.start_mark
                )
            seen.add(key) if isinstance(key, (str, int, float, bool)) else None
        return super().construct_mapping(node, deep)


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(
            f"config file not found: {path}; pass the path of a YAML run config, e.g. configs/quickstart.yaml"
        )
    if path.is_dir():
        raise ConfigError(f"config path {path} is a directory; pass a YAML file inside it")
    if not path.is_file():  # a device, a FIFO, a socket: reading it could block or never end
        raise ConfigError(
            f"config path {path} is not a regular file; pass the path of a YAML run config, "
            "e.g. configs/quickstart.yaml"
        )
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{path} is {size / 2**20:.0f} MiB, not a run config (a YAML file of a few KiB); "
            "pass the config file, e.g. configs/quickstart.yaml"
        )
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {raw[exc.start]:#04x} on line {line}); save the config as UTF-8"
        ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"malformed YAML at {where}: {problem}; fix the syntax on that line") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (model:, task:, ...), not a {type(data).__name__}")
    return data
