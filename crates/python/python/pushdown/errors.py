"""Errors a pushdown client raises, one class per kind of failure, named after gRPC's codes.

Every error is a :class:`PushdownError`; each kind also derives from the Python built-in a
caller would catch for it, so ``except ValueError`` still catches a refused query and
``except ConnectionError`` an unreachable server::

    try:
        batch = next(it)
    except pushdown.UnavailableError:     # no server answered: retry later
        ...
    except pushdown.InvalidArgumentError:  # the query, options or data values: fix them
        raise

Each message says its kind once (``unauthenticated: no token``, never twice).
"""

from __future__ import annotations

from typing import Dict, Type

__all__ = [
    "PushdownError",
    "InvalidArgumentError",
    "NotFoundError",
    "UnavailableError",
    "TimedOutError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "DataLossError",
    "ChangedError",
    "ResourceExhaustedError",
    "InternalError",
]


class PushdownError(Exception):
    """Any failure of a pushdown client or server. ``kind`` names it (``"NotFound"``)."""

    kind = "Internal"


class InvalidArgumentError(PushdownError, ValueError):
    """The caller's query, options, saved state or data values: the same on every retry."""

    kind = "InvalidArgument"


class NotFoundError(PushdownError, LookupError):
    """A dataset, file or tokenizer that is not there."""

    kind = "NotFound"


class UnavailableError(PushdownError, ConnectionError):
    """No server could be reached, or none answered: may succeed later."""

    kind = "Unavailable"


class TimedOutError(PushdownError, TimeoutError):
    """An answer that did not come in time (``call_timeout_s``, ``stall_timeout_s``)."""

    kind = "TimedOut"


class UnauthenticatedError(PushdownError, PermissionError):
    """No token, or one the server does not accept."""

    kind = "Unauthenticated"


class PermissionDeniedError(PushdownError, PermissionError):
    """A token that does not grant what was asked."""

    kind = "PermissionDenied"


class DataLossError(PushdownError, RuntimeError):
    """Corrupt data, or rows lost or repeated on the way."""

    kind = "DataLoss"


class ChangedError(PushdownError, RuntimeError):
    """What was planned on changed (files, versions, schema): plan or restore again."""

    kind = "Changed"


class ResourceExhaustedError(PushdownError, RuntimeError):
    """A server's budgets (streams, memory) are spent: may succeed later."""

    kind = "ResourceExhausted"


class InternalError(PushdownError, RuntimeError):
    """A bug or a broken peer: the message says which."""

    kind = "Internal"


#: The class of each kind, as the native module names kinds.
BY_KIND: Dict[str, Type[PushdownError]] = {
    cls.kind: cls
    for cls in [
        InvalidArgumentError,
        NotFoundError,
        UnavailableError,
        TimedOutError,
        UnauthenticatedError,
        PermissionDeniedError,
        DataLossError,
        ChangedError,
        ResourceExhaustedError,
        InternalError,
    ]
}
