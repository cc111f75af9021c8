"""Hypothesis strategies for arbitrary (mostly malformed) protobuf messages, from descriptors.

Every field may be absent or hold an extreme value: empty, huge and odd strings, integers at
the edges of their width, NaN and infinities, enum numbers no enum defines, deep nesting and
long repeated fields. Only what protobuf itself can encode is produced: the rest is up to the
service's validation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

F = FieldDescriptor
INT_RANGES = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [v for v in (low, high, -1, 0, 1, 2**31 - 1, 2**53) if low <= v <= high]
    return st.one_of(
        st.sampled_from(edges), st.integers(max(low, -1000), min(high, 10**6)), st.integers(low, high)
    )


def _strings(interesting: Sequence[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=12),
        st.text(alphabet="ab/-_.*", min_size=1, max_size=30),
        st.sampled_from([*interesting, "", " ", "a" * 300, "é" * 70, "\x00", "../..", "a/b/c", "A/B"]),
    )


def _scalar(field: FieldDescriptor, interesting: Sequence[str]) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind in INT_RANGES:
        return _integers(*INT_RANGES[kind])
    if kind in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=64 if kind == F.TYPE_DOUBLE else 32)
    if kind == F.TYPE_BOOL:
        return st.booleans()
    if kind == F.TYPE_STRING:
        return _strings(interesting)
    if kind == F.TYPE_BYTES:
        return st.binary(max_size=40)
    if kind == F.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-3, 200))
    raise AssertionError(f"unexpected field type {kind} of {field.full_name}")


def messages(
    descriptor: Descriptor, interesting: Sequence[str] = (), depth: int = 4
) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor``'s type; ``interesting`` strings (ids in the cell) are drawn often."""
    cls = GetMessageClass(descriptor)
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        value = _field(field, interesting, depth)
        if value is not None:
            optional[field.name] = value

    def build(values: dict[str, Any]) -> Message:
        message = cls()
        for name, value in values.items():
            field = descriptor.fields_by_name[name]
            target = getattr(message, name)
            if _is_map(field):
                value_field = field.message_type.fields_by_name["value"]
                for key, item in value.items():
                    if value_field.type == F.TYPE_MESSAGE:
                        target[key].CopyFrom(item)
                    else:
                        target[key] = item
            elif field.is_repeated:
                if field.type == F.TYPE_MESSAGE:
                    for item in value:
                        target.add().CopyFrom(item)
                else:
                    target.extend(value)
            elif field.type == F.TYPE_MESSAGE:
                target.CopyFrom(value)
            else:
                setattr(message, name, value)
        return message

    return st.fixed_dictionaries({}, optional=optional).map(build)


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == F.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _field(field: FieldDescriptor, interesting: Sequence[str], depth: int) -> st.SearchStrategy[Any] | None:
    if _is_map(field):
        key = _scalar(field.message_type.fields_by_name["key"], interesting)
        value_field = field.message_type.fields_by_name["value"]
        value = _single(value_field, interesting, depth - 1)
        return None if value is None else st.dictionaries(key, value, max_size=5)
    single = _single(field, interesting, depth - 1 if field.type == F.TYPE_MESSAGE else depth)
    if single is None:
        return None
    if field.is_repeated:
        return st.lists(single, max_size=5)
    return single


def _single(field: FieldDescriptor, interesting: Sequence[str], depth: int) -> st.SearchStrategy[Any] | None:
    if field.type != F.TYPE_MESSAGE:
        return _scalar(field, interesting)
    if depth <= 0:
        return None
    return st.deferred(lambda: messages(field.message_type, interesting, depth))
