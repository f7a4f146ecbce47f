"""Check a client's frame before kio decodes it: every array's count must fit the bytes left.

kio's native reader reserves memory for an array as soon as it reads the array's count, before
it reads an element. A count is a client's to choose: a compact array's count is a varint of up
to 2**35, so a ten-byte request can ask for hundreds of gigabytes, and a failed allocation in
native code aborts the whole process (no exception reaches Python). Every element of every
array takes at least one byte, so a count larger than the bytes left in the frame is garbage;
this walk follows a kio schema by lengths only and refuses such a frame before kio sees it.
The walk also refuses strings, byte arrays and tagged fields that run past the frame, so what
it accepts is laid out as kio will read it (the unit tests check the walk against kio's own
reader for every request schema).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from functools import cache
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from kafka_quota_proxy.protocol.primitives import INT16, INT32, Buffer, read_uvarint

# A step reads one value at ``pos`` (never past ``end``) and returns the offset after it.
Step = Callable[[Buffer, int, int], int]

_FIXED = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4, "int64": 8, "uint64": 8, "float64": 8,
    "timedelta_i64": 8, "datetime_i64": 8, "uuid": 16,
}


class CountOverrun(ValueError):
    """A count or length in the frame says more than the bytes left."""


def check(cls: type, buf: Buffer, pos: int = 0, end: int | None = None) -> int:
    """Walk one ``cls`` (a kio entity) at ``pos``; return the offset just past it. Raises
    ``CountOverrun`` when a count or length says more than the bytes left before ``end``."""
    try:
        return _entity_step(cls)(buf, pos, len(buf) if end is None else end)
    except (IndexError, ValueError, struct.error) as exc:  # (ValueError: a 6-byte varint)
        if isinstance(exc, CountOverrun):
            raise
        raise CountOverrun(f"the frame ends inside a field ({exc})") from None


def _fixed(size: int) -> Step:
    def step(buf: Buffer, pos: int, end: int) -> int:
        pos += size
        if pos > end:
            raise CountOverrun("the frame ends inside a field")
        return pos
    return step


def _sized(length: Callable[[Buffer, int], tuple[int, int]]) -> Step:
    """A string or byte array: a length (null below zero) then that many bytes."""
    def step(buf: Buffer, pos: int, end: int) -> int:
        n, pos = length(buf, pos)
        if n < -1:
            raise CountOverrun(f"length {n}")
        pos += max(n, 0)
        if pos > end:
            raise CountOverrun(f"length {n} runs past the frame")
        return pos
    return step


def _legacy16(buf: Buffer, pos: int) -> tuple[int, int]:
    return INT16.unpack_from(buf, pos)[0], pos + 2


def _legacy32(buf: Buffer, pos: int) -> tuple[int, int]:
    return INT32.unpack_from(buf, pos)[0], pos + 4


def _compact(buf: Buffer, pos: int) -> tuple[int, int]:
    n, pos = read_uvarint(buf, pos)
    return n - 1, pos


def _array(element: Step, flexible: bool, fixed: int) -> Step:
    count = _compact if flexible else _legacy32

    def step(buf: Buffer, pos: int, end: int) -> int:
        n, pos = count(buf, pos)
        if n < -1 or n > end - pos:  # every element takes at least one byte
            raise CountOverrun(f"array count {n} with {end - pos} bytes left")
        if fixed:
            pos += max(n, 0) * fixed
            if pos > end:
                raise CountOverrun(f"array count {n} runs past the frame")
            return pos
        for _ in range(n):
            pos = element(buf, pos, end)
        return pos
    return step


def _nullable(entity: Step) -> Step:
    def step(buf: Buffer, pos: int, end: int) -> int:
        if pos >= end:
            raise CountOverrun("the frame ends before a struct")
        return pos + 1 if buf[pos] == 0xFF else entity(buf, pos + 1, end)  # -1: null
    return step


def _field_step(field: dataclasses.Field[Any], flexible: bool, tagged: bool) -> Step:
    kind = classify_field(field)
    optional = False if tagged else is_optional(field)  # (as kio reads tagged fields)
    if isinstance(kind, (EntityField, EntityTupleField)):
        element = _entity_step(kind.type_)
        if isinstance(kind, EntityField):
            return _nullable(element) if optional else element
        return _array(element, flexible, 0)
    kafka_type = get_schema_field_type(field)
    size = _FIXED.get(kafka_type, 0)
    if size:
        element = _fixed(size)
    elif kafka_type == "string":
        element = _sized(_compact if flexible else _legacy16)
    elif kafka_type in ("bytes", "records"):
        element = _sized(_compact if flexible else _legacy32)
    else:
        raise NotImplementedError(f"kafka_type {kafka_type!r} of {field.name}")
    if isinstance(kind, PrimitiveTupleField):
        return _array(element, flexible, size)
    return element


@cache
def _entity_step(cls: type) -> Step:
    flexible = bool(getattr(cls, "__flexible__", False))
    steps: list[Step] = []
    tags: dict[int, Step] = {}
    for field in dataclasses.fields(cls):
        tag = get_field_tag(field)
        if tag is None:
            steps.append(_field_step(field, flexible, False))
        else:
            tags[int(tag)] = _field_step(field, flexible, True)

    def step(buf: Buffer, pos: int, end: int) -> int:
        for s in steps:
            pos = s(buf, pos, end)
        if not flexible:
            return pos
        n, pos = read_uvarint(buf, pos)
        if n > end - pos:
            raise CountOverrun(f"tagged field count {n} with {end - pos} bytes left")
        for _ in range(n):
            tag, pos = read_uvarint(buf, pos)
            size, pos = read_uvarint(buf, pos)
            stop = pos + size
            if stop > end:
                raise CountOverrun(f"tagged field {tag} of {size} bytes runs past the frame")
            known = tags.get(tag)
            if known is not None:
                known(buf, pos, stop)
            pos = stop
        if pos > end:
            raise CountOverrun("the frame ends inside a field")
        return pos
    return step
