"""Refusing a request a service cannot take: the field it names, page tokens, the gRPC refusal.

Inbound conversions raise :class:`InvalidField` naming the offending field by its path in the
request; a servicer answers it with INVALID_ARGUMENT and the field in the message
(:func:`invalid_fields_refused`). Listing calls page with opaque tokens: the last key of a
page, base64-encoded, resumes after it (:func:`first_page`).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
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


def first_page(keyed: Iterable[tuple[str | int, T]], size: int) -> tuple[list[T], str]:
    """The first ``size`` items of ``keyed`` ((key, item) pairs in key order, already past the
    request's page token and filtered), and the token of the page after them ("" if none follows)."""
    page: list[T] = []
    last: str | int = ""
    for key, item in keyed:
        if len(page) == size:
            return page, page_token(last)
        page.append(item)
        last = key
    return page, ""


def page_size(requested: int, default: int, maximum: int) -> int:
    """How many items a page holds: ``requested`` (0 = ``default``), at most ``maximum``."""
    if requested < 0:
        raise InvalidField("page_size", "must be >= 0")
    return min(requested or default, maximum)


def requested_page(
    request: Any, default: int, maximum: int, parse: Callable[[str], T], first: T
) -> tuple[int, T]:
    """The page a listing request (``page_size``, ``page_token``) asks for: how many items it
    holds (:func:`page_size`) and the key it resumes after, read by ``parse`` (``first``, a key
    before every other, without a token)."""
    size = page_size(request.page_size, default, maximum)
    return size, after_page_token(request.page_token, parse) if request.page_token else first


async def abort(context: Any, code: grpc.StatusCode, message: str, reason: str = "") -> NoReturn:
    """End the call with ``code`` and ``message``, and ``reason`` (an :mod:`error_reasons` value)
    in the trailing metadata when the code alone is ambiguous."""
    await context.abort(code, message, trailing_metadata=reason_metadata(reason) if reason else ())
    raise AssertionError("unreachable")  # context.abort raises


@asynccontextmanager
async def invalid_fields_refused(context: Any) -> AsyncIterator[None]:
    """Run the block; an :class:`InvalidField` it raises ends the call with INVALID_ARGUMENT,
    the message naming the field."""
    try:
        yield
    except InvalidField as error:
        await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
