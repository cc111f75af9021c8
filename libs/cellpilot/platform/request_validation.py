"""Refusing a request a service cannot take: the field it names, page tokens, the gRPC refusal.

Inbound conversions raise :class:`InvalidField` naming the offending field by its path in the
request; a servicer answers it with INVALID_ARGUMENT and the field in the message. Listing
calls page with opaque tokens: the last key of a page, base64-encoded, resumes after it.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import grpc

from cellpilot.platform.error_reasons import reason_metadata

T = TypeVar("T")


class InvalidField(ValueError):  # noqa: N818 - a request error, named for what is wrong
    """``field`` (its path in the request) holds a value the service cannot take."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def page_token(after: str | int) -> str:
    """The token of the page after ``after`` (the last key of this page); "" for no key."""
    text = str(after)
    return base64.urlsafe_b64encode(text.encode()).decode() if text else ""


def after_page_token(token: str, parse: Callable[[str], T]) -> T:
    """The key a :func:`page_token` names, read by ``parse`` (``str``, ``int``)."""
    try:
        return parse(base64.urlsafe_b64decode(token.encode()).decode())
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidField("page_token", "not a token this server issued") from error


def page_size(requested: int, default: int, maximum: int) -> int:
    """How many items a page holds: ``requested`` (0 = ``default``), at most ``maximum``."""
    if requested < 0:
        raise InvalidField("page_size", "must be >= 0")
    return min(requested or default, maximum)


async def abort(context: Any, code: grpc.StatusCode, message: str, reason: str = "") -> NoReturn:
    """End the call with ``code`` and ``message``, and ``reason`` (an :mod:`error_reasons` value)
    in the trailing metadata when the code alone is ambiguous."""
    await context.abort(code, message, trailing_metadata=reason_metadata(reason) if reason else ())
    raise AssertionError("unreachable")  # context.abort raises
