"""What can go wrong in the model library, in one leaf module every part of it imports."""

from __future__ import annotations


class ModelNotFound(LookupError):
    """No installed or remote model has that name; the message lists the ones that exist."""


class InvalidModelName(ValueError):
    pass


class InvalidSource(ValueError):
    """Not something Serge can pull: says what would be."""


class PullCancelled(Exception):
    """The pull was cancelled; nothing was installed."""


class PullFailed(RuntimeError):
    """The pull did not succeed; the message says why. Nothing was installed."""


class PullNotFound(LookupError):
    pass


class PullRefused(RuntimeError):
    """This pull cannot start now (too many running, or the model is there already)."""
