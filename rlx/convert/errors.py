"""The one exception type of rlx.convert: a problem with the user's input, printed without a traceback."""

from __future__ import annotations


class ConvertError(ValueError):
    """Bad input to a conversion (missing shard, wrong destination, unsupported model...).

    The message names the problem and the fix; the CLI prints it and exits with status 2.
    """
