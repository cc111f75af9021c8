"""Refusing requests and paging listings (cellpilot.platform.request_validation).

A listing call's page holds at most ``page_size`` items after the key its token names; the
token of the next page names the last item of this one, and there is none after the last
page. An :class:`InvalidField` raised while reading a request ends the call with
INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from cellpilot.platform.request_validation import (
    InvalidField,
    after_page_token,
    first_page,
    invalid_fields_refused,
    page_token,
    requested_page,
)


@dataclass
class ListRequest:
    page_size: int = 0
    page_token: str = ""


class CallAbortedError(Exception):
    pass


class RecordingContext:
    """What a grpc.aio servicer context does on abort: raise, after noting the status."""

    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, message: str, trailing_metadata: Any = ()) -> None:
        self.aborted = (code, message)
        raise CallAbortedError(message)


@pytest.mark.parametrize(
    ("size", "expected_items", "next_after"),
    [(2, ["a", "b"], "b"), (3, ["a", "b", "c"], None), (5, ["a", "b", "c"], None)],
    ids=["more-follow", "exactly-the-rest", "fewer-than-a-page"],
)
def test_a_page_holds_at_most_its_size_and_names_the_next(
    size: int, expected_items: list[str], next_after: str | None
) -> None:
    page, token = first_page(((key, key) for key in "abc"), size)
    assert page == expected_items
    assert token == ("" if next_after is None else page_token(next_after))
    if next_after is not None:
        assert after_page_token(token, str) == next_after


def test_integer_keys_page_too() -> None:
    page, token = first_page([(10, "x"), (20, "y")], 1)
    assert (page, after_page_token(token, int)) == (["x"], 10)


def test_a_request_without_a_token_starts_before_every_key() -> None:
    assert requested_page(ListRequest(), 100, 500, str, "") == (100, "")
    assert requested_page(ListRequest(page_size=900), 100, 500, int, -1) == (500, -1)
    assert requested_page(ListRequest(3, page_token("m7")), 100, 500, str, "") == (3, "m7")


@pytest.mark.parametrize(
    ("request_", "field"),
    [(ListRequest(page_size=-1), "page_size"), (ListRequest(page_token="%%"), "page_token")],
)
def test_a_bad_page_request_names_its_field(request_: ListRequest, field: str) -> None:
    with pytest.raises(InvalidField) as raised:
        requested_page(request_, 100, 500, int, 0)
    assert raised.value.field == field


async def test_an_invalid_field_ends_the_call_with_invalid_argument() -> None:
    context = RecordingContext()
    with pytest.raises(CallAbortedError):
        async with invalid_fields_refused(context):
            raise InvalidField("spec.limits.cpu_millicores", "must be >= 0")
    assert context.aborted == (grpc.StatusCode.INVALID_ARGUMENT, "spec.limits.cpu_millicores: must be >= 0")


async def test_a_valid_request_goes_on_and_other_errors_pass() -> None:
    context = RecordingContext()
    async with invalid_fields_refused(context):
        value = 1
    assert (value, context.aborted) == (1, None)
    with pytest.raises(KeyError):
        async with invalid_fields_refused(context):
            raise KeyError("not a field")
    assert context.aborted is None
