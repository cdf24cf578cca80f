"""The one exception type for bad configs; the CLI prints its message and exits 2."""


class ConfigError(ValueError):
    """A run config that cannot be used, with a message naming the key and the fix."""
