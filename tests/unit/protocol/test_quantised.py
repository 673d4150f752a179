"""Quantised tensors on the wire (protocol 1.6, protocol/quantised.py): the header's fields, the
payload's length, dtype and scale checks, the bytes per element the planner prices, the version gate."""
from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import FieldError, TensorError
from protocol.errors import FieldError
from protocol.quantised import (Quantised, bytes_per_element, speaks_channels, speaks_offsets, speaks_quantised,
                                split)
from protocol.tensors import TensorPayload
from tests.unit.protocol.codec_support import FAST


def packed(header: Quantised, scales: list[float]) -> TensorPayload:
    data = struct.pack(f"<{len(scales)}f", *scales) + bytes(header.value_bytes)
    return TensorPayload("uint8", (len(data),), data)


@pytest.mark.parametrize("kwargs,field", [
    (dict(codec="int2", block=64, shape=(4,)), "codec"),
    (dict(codec="int8", block=4, shape=(4,)), "block"),
    (dict(codec="int8", block=10**6, shape=(4,)), "block"),
    (dict(codec="int4", block=64, shape=(-1,)), "shape"),
])
def test_header_fields_are_checked(kwargs, field):
    with pytest.raises(FieldError) as info:
        Quantised(**kwargs)
    assert info.value.field == field


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0])
def test_a_bad_scale_is_refused(bad):
    h = Quantised("int8", 64, (3, 64))
    split(h, packed(h, [1.0, 2.0, 0.5]))
    with pytest.raises(TensorError):
        split(h, packed(h, [1.0, bad, 0.5]))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_min_max_blocks_refuse_a_non_finite_offset_and_take_a_negative_one(bad):
    h = Quantised("int4", 64, (2, 64), offsets=True)
    assert h.packed_bytes == 4 * 4 + 64
    scales, offsets, values = split(h, packed(h, [1.0, 0.5, -3.0, 2.0]))
    assert (len(scales), len(offsets), len(values)) == (8, 8, 64)
    with pytest.raises(TensorError, match="offset"):
        split(h, packed(h, [1.0, 0.5, -3.0, bad]))
    with pytest.raises(TensorError, match="offset"):   # +inf and -inf must not cancel out
        split(h, packed(h, [1.0, 0.5, math.inf, -math.inf]))
    with pytest.raises(TensorError, match="scale"):
        split(h, packed(h, [-1.0, 0.5, 0.0, 0.0]))
    with pytest.raises(TensorError):                    # without room for the offsets
        split(h, packed(Quantised("int4", 64, (2, 64)), [1.0, 0.5]))


@FAST
@given(st.sampled_from(["int8", "int4"]), st.integers(8, 100), st.integers(0, 300), st.integers(-40, 40),
       st.booleans())
def test_any_wrong_length_is_refused(codec_, block, n, delta, offsets):
    h = Quantised(codec_, block, (n,), offsets)
    good = h.packed_bytes
    size = max(0, good + delta)
    payload = TensorPayload("uint8", (size,), bytes(size))
    if size == good:
        split(h, payload)
    else:
        with pytest.raises(TensorError):
            split(h, payload)
    with pytest.raises(TensorError):     # right size, wrong dtype
        split(h, TensorPayload("int8", (good,), bytes(good)))


def test_ratio_and_version_gate():
    assert bytes_per_element("int8") == 1.0625 and bytes_per_element("int4") == 0.5625
    assert not speaks_quantised(None) and not speaks_quantised((1, 5)) and speaks_quantised((1, 6))
    assert bytes_per_element("int4", offsets=True) == 0.625
    assert not speaks_offsets(None) and not speaks_offsets((1, 10)) and speaks_offsets((1, 11))


def test_channel_blocks_need_a_channel_dimension_and_keep_the_byte_count():
    assert not speaks_channels(None) and not speaks_channels((1, 11)) and speaks_channels((1, 12))
    h = Quantised("int4", 64, (3, 5, 7), offsets=True, channels=True)
    assert h.packed_bytes == Quantised("int4", 64, (3, 5, 7), offsets=True).packed_bytes
    for shape in [(64,), (), (4, 0)]:       # a sender's mistake or a forged header: refused on arrival
        with pytest.raises(FieldError, match="channel"):
            Quantised("int8", 64, shape, channels=True)
