"""Generic limits on protobuf requests, checked before any servicer logic sees them.

gRPC's ``max_receive_message_length`` already refuses oversized messages as a whole; this
walk refuses the shapes a small message can still have that make servicers slow or state
odd: overlong strings and identifiers, huge repeated fields and maps, deep nesting, enum
numbers the schema does not define (proto3 keeps unknown numbers), and NaN or infinite
floats. Semantic checks (ranges of priorities, valid job names) stay with the servicers;
this is the floor every API gets for free. Each problem names the field path, e.g.
``spec.task.runtime.process.args[3]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

IDENTIFIER_NAMES = frozenset({"name", "user", "owner"})
IDENTIFIER_SUFFIXES = ("_id", "_name")


@dataclass(frozen=True)
class RequestLimits:
    max_string_chars: int = 4096
    max_identifier_chars: int = 256  # fields called name, user, owner, *_id, *_name
    max_bytes: int = 1024 * 1024
    max_repeated: int = 10_000
    max_map_entries: int = 1_000
    max_depth: int = 16  # nested messages below the request itself
    # Per field (full name, e.g. "cellpilot.api.v1.DesiredTasks.tasks"): a different maximum
    # length (strings, bytes) or count (repeated fields, maps).
    overrides: Mapping[str, int] = field(default_factory=dict)


DEFAULT_LIMITS = RequestLimits()


class InvalidRequestError(ValueError):
    """A request outside the limits; ``field`` is the path of the offending field."""

    def __init__(self, field_path: str, problem: str) -> None:
        super().__init__(f"{field_path}: {problem}")
        self.field = field_path
        self.problem = problem


def _is_identifier(name: str) -> bool:
    return name in IDENTIFIER_NAMES or name.endswith(IDENTIFIER_SUFFIXES)


def _check_scalar(fd: FieldDescriptor, value: Any, path: str, limits: RequestLimits) -> None:
    if fd.type == FieldDescriptor.TYPE_STRING:
        default = limits.max_identifier_chars if _is_identifier(fd.name) else limits.max_string_chars
        maximum = limits.overrides.get(fd.full_name, default)
        if len(value) > maximum:
            raise InvalidRequestError(path, f"{len(value)} characters, at most {maximum} allowed")
    elif fd.type == FieldDescriptor.TYPE_BYTES:
        maximum = limits.overrides.get(fd.full_name, limits.max_bytes)
        if len(value) > maximum:
            raise InvalidRequestError(path, f"{len(value)} bytes, at most {maximum} allowed")
    elif fd.type == FieldDescriptor.TYPE_ENUM:
        enum = fd.enum_type
        if enum is not None and enum.values_by_number.get(value) is None:
            raise InvalidRequestError(path, f"{value} is not a value of {enum.name}")
    elif fd.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT) and not math.isfinite(value):
        raise InvalidRequestError(path, f"{value} is not a finite number")


def _walk(message: Message, path: str, depth: int, limits: RequestLimits) -> None:
    if depth > limits.max_depth:
        raise InvalidRequestError(path or "request", f"nested deeper than {limits.max_depth} levels")
    for fd, value in message.ListFields():
        here = f"{path}.{fd.name}" if path else fd.name
        entry_type = fd.message_type if fd.type == FieldDescriptor.TYPE_MESSAGE else None
        if entry_type is not None and entry_type.GetOptions().map_entry:
            maximum = limits.overrides.get(fd.full_name, limits.max_map_entries)
            if len(value) > maximum:
                raise InvalidRequestError(here, f"{len(value)} entries, at most {maximum} allowed")
            key_fd = entry_type.fields_by_name["key"]
            value_fd = entry_type.fields_by_name["value"]
            for key, item in value.items():
                entry = f"{here}[{key!r}]" if isinstance(key, str) and len(key) <= 64 else f"{here}[key]"
                _check_scalar(key_fd, key, entry, limits)
                if value_fd.type == FieldDescriptor.TYPE_MESSAGE:
                    _walk(item, entry, depth + 1, limits)
                else:
                    _check_scalar(value_fd, item, entry, limits)
        elif fd.is_repeated:
            maximum = limits.overrides.get(fd.full_name, limits.max_repeated)
            if len(value) > maximum:
                raise InvalidRequestError(here, f"{len(value)} items, at most {maximum} allowed")
            for index, item in enumerate(value):
                if fd.type == FieldDescriptor.TYPE_MESSAGE:
                    _walk(item, f"{here}[{index}]", depth + 1, limits)
                else:
                    _check_scalar(fd, item, f"{here}[{index}]", limits)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            _walk(value, here, depth + 1, limits)
        else:
            _check_scalar(fd, value, here, limits)


def validate_request(message: Message, limits: RequestLimits = DEFAULT_LIMITS) -> None:
    """Raise :class:`InvalidRequestError` naming the first field outside ``limits``."""
    _walk(message, "", 0, limits)
