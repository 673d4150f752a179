"""Torch-free tensor payloads: header/size validation, chunking and strict reassembly."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol.errors import FieldError, ProtocolError, TensorError
from protocol.messages import StreamChunk
from protocol.tensors import (DEFAULT_CHUNK_BYTES, DTYPE_ITEMSIZE, MAX_NDIM, ChunkAssembler,
                              TensorChunk, TensorPayload, split_payload)

dtypes = st.sampled_from(sorted(DTYPE_ITEMSIZE))


def nbytes(dtype, shape):
    return math.prod(shape) * DTYPE_ITEMSIZE[dtype]


def chunk(dtype="int8", shape=(8,), index=0, count=2, data=b"abcd", total=None):
    return TensorChunk(dtype, shape, index, count, nbytes(dtype, shape) if total is None else total, data)


# ---------------------------------------------------------------------------------------------
# TensorPayload
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", sorted(DTYPE_ITEMSIZE))
def test_payload_size_must_match_dtype_and_shape(dtype):
    size = DTYPE_ITEMSIZE[dtype] * 6
    payload = TensorPayload(dtype, (2, 3), bytes(size))
    assert payload.nbytes == size
    for wrong in (size - 1, size + 1, 0):
        with pytest.raises(FieldError) as info:
            TensorPayload(dtype, (2, 3), bytes(wrong))
        assert info.value.field == "data"
        assert str(size) in str(info.value)


def test_itemsizes():
    assert DTYPE_ITEMSIZE["float32"] == 4 and DTYPE_ITEMSIZE["bfloat16"] == 2
    assert DTYPE_ITEMSIZE["float64"] == 8 and DTYPE_ITEMSIZE["bool"] == 1


def test_scalar_and_empty_shapes():
    assert TensorPayload("float32", (), bytes(4)).nbytes == 4      # a scalar has one element
    assert TensorPayload("float32", (0, 5), b"").nbytes == 0
    with pytest.raises(FieldError):
        TensorPayload("float32", (), b"")


@pytest.mark.parametrize("dtype", ["complex64", "float", "", "FLOAT32", "object", "torch.float32"])
def test_payload_rejects_unknown_dtypes(dtype):
    with pytest.raises(FieldError) as info:
        TensorPayload(dtype, (1,), bytes(4))
    assert info.value.field == "dtype"


@pytest.mark.parametrize("shape", [(-1,), (2, -3), (-4, -1)])
def test_payload_rejects_negative_dimensions(shape):
    with pytest.raises(FieldError) as info:
        TensorPayload("int8", shape, b"")
    assert info.value.field == "shape"


def test_payload_dimension_limit():
    assert TensorPayload("int8", (1,) * MAX_NDIM, b"\x00").nbytes == 1
    with pytest.raises(FieldError) as info:
        TensorPayload("int8", (1,) * (MAX_NDIM + 1), b"\x00")
    assert info.value.field == "shape"


def test_huge_declared_shape_is_rejected_cheaply():
    with pytest.raises(FieldError):
        TensorPayload("float64", (2**40, 2**40), b"")


# ---------------------------------------------------------------------------------------------
# TensorChunk
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("index,count", [(2, 2), (-1, 2), (0, 0), (5, 1)])
def test_chunk_index_must_lie_in_count(index, count):
    with pytest.raises(FieldError) as info:
        chunk(index=index, count=count)
    assert info.value.field == "index"


def test_chunk_total_must_match_header():
    with pytest.raises(FieldError) as info:
        chunk(total=9)
    assert info.value.field == "total_bytes"
    with pytest.raises(FieldError) as info:
        chunk(dtype="int32", shape=(8,), total=8)
    assert info.value.field == "total_bytes"
    with pytest.raises(FieldError) as info:
        chunk(dtype="quint4", total=8)
    assert info.value.field == "dtype"


# ---------------------------------------------------------------------------------------------
# split_payload + ChunkAssembler
# ---------------------------------------------------------------------------------------------
@st.composite
def payloads(draw, max_elems=600):
    dtype = draw(dtypes)
    shape = tuple(draw(st.lists(st.integers(0, 12), min_size=0, max_size=3)))
    if math.prod(shape) > max_elems:
        shape = (draw(st.integers(0, max_elems)),)
    return TensorPayload(dtype, shape, draw(st.binary(min_size=nbytes(dtype, shape),
                                                      max_size=nbytes(dtype, shape))))


@settings(max_examples=200, deadline=None)
@given(payloads(), st.integers(1, 700))
def test_split_and_assemble_round_trip(payload, chunk_bytes):
    parts = split_payload(payload, chunk_bytes)
    n = payload.nbytes
    assert len(parts) == max(1, math.ceil(n / chunk_bytes))
    assert b"".join(p.data for p in parts) == payload.data
    for i, part in enumerate(parts):
        assert (part.index, part.count, part.total_bytes) == (i, len(parts), n)
        assert (part.dtype, part.shape) == (payload.dtype, payload.shape)
        assert len(part.data) <= chunk_bytes
        if i < len(parts) - 1:
            assert len(part.data) == chunk_bytes
    assembler = ChunkAssembler(max_total_bytes=n)
    for part in parts[:-1]:
        assert assembler.add(part) is None
    assert assembler.add(parts[-1]) == payload


@settings(max_examples=100, deadline=None)
@given(payloads(max_elems=200), st.integers(1, 64))
def test_chunks_survive_the_codec(payload, chunk_bytes):
    assembler = ChunkAssembler()
    result = None
    for part in split_payload(payload, chunk_bytes):
        assert result is None
        wire = codec.decode(codec.encode(StreamChunk(part)), expected=StreamChunk)
        result = assembler.add(wire.chunk)
    assert result == payload


def test_split_defaults_and_bad_chunk_size():
    assert DEFAULT_CHUNK_BYTES < 4 * 1024 * 1024                 # below hivemind's message limit
    big = TensorPayload("uint8", (DEFAULT_CHUNK_BYTES + 1,), bytes(DEFAULT_CHUNK_BYTES + 1))
    assert [len(c.data) for c in split_payload(big)] == [DEFAULT_CHUNK_BYTES, 1]
    empty = TensorPayload("float32", (0,), b"")
    [only] = split_payload(empty)
    assert (only.index, only.count, only.data) == (0, 1, b"")
    assert ChunkAssembler().add(only) == empty
    for bad in (0, -1):
        with pytest.raises(ValueError):
            split_payload(empty, bad)


def _parts(n=10, chunk_bytes=4):
    payload = TensorPayload("uint8", (n,), bytes(range(n)))
    return payload, split_payload(payload, chunk_bytes)          # chunks of 4, 4, 2


def test_assembler_rejects_out_of_order():
    _, parts = _parts()
    with pytest.raises(TensorError):
        ChunkAssembler().add(parts[1])                           # stream must start at 0
    a = ChunkAssembler()
    a.add(parts[0])
    with pytest.raises(TensorError):
        a.add(parts[2])                                          # gap
    with pytest.raises(TensorError):
        a.add(parts[0])                                          # duplicate


def test_assembler_rejects_chunks_after_completion():
    payload, parts = _parts()
    a = ChunkAssembler()
    results = [a.add(p) for p in parts]
    assert results[-1] == payload
    for p in parts:
        with pytest.raises(TensorError):
            a.add(p)


@pytest.mark.parametrize("changed", [
    dict(dtype="int8"),                                          # same size, other dtype
    dict(shape=(2, 5)),                                          # same size, other shape
    dict(shape=(11,)),                                           # other size
    dict(count=4),
], ids=lambda d: next(iter(d)))
def test_assembler_rejects_inconsistent_header(changed):
    _, parts = _parts()
    a = ChunkAssembler()
    a.add(parts[0])
    fields = dict(dtype="uint8", shape=(10,), index=1, count=3, data=parts[1].data)
    fields.update(changed)
    with pytest.raises(TensorError):
        a.add(chunk(**fields))


def test_assembler_rejects_extra_bytes():
    _, parts = _parts()
    a = ChunkAssembler()
    a.add(parts[0])
    a.add(parts[1])
    with pytest.raises(TensorError):
        a.add(chunk("uint8", (10,), 2, 3, b"\x00" * 3))          # 11 bytes for a 10-byte tensor
    # a single chunk longer than the whole tensor
    with pytest.raises(TensorError):
        ChunkAssembler().add(chunk("uint8", (4,), 0, 2, b"\x00" * 5))


def test_assembler_rejects_too_short_stream():
    _, parts = _parts()
    a = ChunkAssembler()
    a.add(parts[0])
    a.add(parts[1])
    with pytest.raises(TensorError):
        a.add(chunk("uint8", (10,), 2, 3, b"\x00"))              # 9 of 10 bytes at the end
    with pytest.raises(TensorError):
        ChunkAssembler().add(chunk("float32", (4,), 0, 1, bytes(15)))


def test_assembler_rejects_oversized_total_before_buffering():
    a = ChunkAssembler(max_total_bytes=100)
    # the first chunk carries 1 byte but declares 2**40: rejected on the header alone
    with pytest.raises(TensorError) as info:
        a.add(chunk("uint8", (2**40,), 0, 2**30, b"\x00"))
    assert "limit" in str(info.value)
    with pytest.raises(TensorError):
        a.add(chunk("float32", (26,), 0, 1, bytes(104)))
    ok = TensorPayload("float32", (25,), bytes(100))
    assert ChunkAssembler(max_total_bytes=100).add(split_payload(ok)[0]) == ok


def test_rejected_chunk_leaves_assembler_unchanged():
    payload, parts = _parts()
    a = ChunkAssembler()
    with pytest.raises(TensorError):
        a.add(parts[2])                                          # wrong start: must not stick
    assert a.add(parts[0]) is None
    with pytest.raises(TensorError):
        a.add(chunk("uint8", (10,), 1, 3, b"\x00" * 7))          # too many bytes: not buffered
    with pytest.raises(TensorError):
        a.add(chunk("uint8", (11,), 1, 3, b"\x00" * 4))          # other header: not kept
    assert a.add(parts[1]) is None
    with pytest.raises(TensorError):
        a.add(chunk("uint8", (10,), 2, 3, b"\x00"))              # last chunk, short: not buffered
    assert a.add(parts[2]) == payload


chunk_specs = st.builds(
    lambda dtype, n, count, index, data: (dtype, (n,), index % count, count, data),
    st.sampled_from(["uint8", "int16"]), st.integers(0, 12), st.integers(1, 4),
    st.integers(0, 3), st.binary(max_size=12))


@settings(max_examples=300, deadline=None)
@given(st.lists(chunk_specs, min_size=1, max_size=8), st.integers(0, 30))
def test_assembler_fuzz_only_tensor_errors(specs, limit):
    a = ChunkAssembler(max_total_bytes=limit)
    for dtype, shape, index, count, data in specs:
        c = TensorChunk(dtype, shape, index, count, nbytes(dtype, shape), data)
        try:
            result = a.add(c)
        except TensorError:
            continue
        assert c.total_bytes <= limit
        if result is not None:
            assert isinstance(result, TensorPayload)
            assert (result.dtype, result.shape, result.nbytes) == (dtype, shape, c.total_bytes)


def test_tensor_error_is_a_protocol_error():
    assert issubclass(TensorError, ProtocolError)
