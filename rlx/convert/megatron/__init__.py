"""Hugging Face <-> megatron-core torch_dist for Llama / Qwen2 / Qwen3 (see ``mapping``).

megatron-core is an optional dependency (the ``megatron`` extra): ``require_megatron`` refuses a
conversion that needs it before any work is done, naming the install command."""

from __future__ import annotations

import importlib.util

from rlx.convert.errors import ConvertError

INSTALL_HINT = 'pip install -e ".[megatron]"'


def require_megatron(what: str) -> None:
    """Raise a ConvertError naming ``INSTALL_HINT`` when megatron-core cannot be imported."""
    try:
        found = importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):  # no parent package, or one set aside in sys.modules
        found = False
    if not found:
        raise ConvertError(
            f"{what} needs megatron-core, which is not installed; run `{INSTALL_HINT}` in the rlx "
            "checkout (or pip install 'rlx[megatron]'), then convert again"
        )
