"""One table per enum between the core's enumerations and the v1 API's.

The core names its members like the API's values without their prefix
(:mod:`cellpilot.job_vocabulary`: ``SCALING_MODE_DRY_RUN`` is ``ScalingMode.DRY_RUN``), so a
:class:`WireEnum` pairs the two by name, once; each service's ``convert`` module holds the
tables it needs and turns :class:`UnknownWireValueError` into its own request error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import Enum
from typing import Any, Generic, TypeVar

E = TypeVar("E", bound=Enum)


class UnknownWireValueError(ValueError):
    """A wire value with no member here: unknown to the API, or with no core meaning (``*_UNSPECIFIED``)."""


def wire_prefix(wrapper: Any) -> str:
    """``ScalingMode`` -> ``SCALING_MODE_``: the prefix protoc's enum values carry."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", wrapper.DESCRIPTOR.name).upper() + "_"


class WireEnum(Generic[E]):
    """A core enum and an API enum (its protoc wrapper), member by member by name.

    ``read_as`` reads some wire values as another member (an API default such as
    UNSPECIFIED read as OFF). A core member the API has no value for (an internal state)
    cannot be sent.
    """

    def __init__(self, core: type[E], wrapper: Any, read_as: Mapping[str, E] | None = None) -> None:
        self.core = core
        self.wrapper = wrapper
        prefix = wire_prefix(wrapper)
        names = set(wrapper.keys())
        self._out: dict[E, int] = {
            member: wrapper.Value(prefix + member.name) for member in core if prefix + member.name in names
        }
        self._in: dict[int, E] = {value: member for member, value in self._out.items()}
        for name, member in (read_as or {}).items():
            self._in[wrapper.Value(prefix + name)] = member

    def to_core(self, value: int) -> E:
        member = self._in.get(value)
        if member is not None:
            return member
        try:
            name = self.wrapper.Name(value)
        except ValueError:
            raise UnknownWireValueError(f"unknown value {value}") from None
        raise UnknownWireValueError(f"{name} is not a valid value here")

    def get(self, value: int, default: E) -> E:
        """The member of ``value``, ``default`` for a value with none (lenient reads)."""
        return self._in.get(value, default)

    def to_wire(self, member: E) -> Any:
        return self._out[member]


_TABLES: dict[tuple[type[Enum], Any], WireEnum[Any]] = {}


def wire_enum(core: type[E], wrapper: Any) -> WireEnum[E]:
    """The by-name table of ``core`` and ``wrapper``, built once."""
    table = _TABLES.get((core, wrapper))
    if table is None:
        table = _TABLES[(core, wrapper)] = WireEnum(core, wrapper)
    return table
