"""The two exceptions of weight sync: a peer that did not answer in time, and one that failed."""

from __future__ import annotations


class SyncError(RuntimeError):
    """A sync that cannot complete: a failed or malformed acknowledgement, a checksum mismatch,
    a receiver that rejected a bucket. The message names the peer and, where known, the tensor."""


class SyncTimeout(SyncError, TimeoutError):
    """No reply from a peer within the deadline; the message names the peer and the request."""
