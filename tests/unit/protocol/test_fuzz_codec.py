"""Large-scale fuzzing of everything a remote peer's bytes reach before a handler: the envelope
codec (mutated, re-typed and re-bodied frames of every message type), stream reassembly and the
tensor decoder. Only ProtocolError / BadTensor may ever come out; about 7,000 inputs in all."""
import dataclasses

import msgpack
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol.errors import ProtocolError
from protocol.plain import to_plain
from protocol.tensors import ChunkAssembler, TensorChunk, TensorPayload
from protocol.version import PROTOCOL_VERSION

from peer.compute import tensor_codec
from peer.compute.errors import BadTensor
from tests.unit.protocol.codec_support import any_message

# fresh examples every run (not derandomised): over many CI runs they add up, while one run
# stays a small share of the suite's 10 minutes
MANY = settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
SOME = settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))

# msgpack values of every kind, nested: what a hostile encoder can put anywhere
leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
                   st.text(max_size=16), st.binary(max_size=16))
values = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)


def decodes_cleanly(data: bytes, **kwargs):
    """decode either returns a real protocol message or raises a ProtocolError; nothing else."""
    try:
        result = codec.decode(data, **kwargs)
    except ProtocolError:
        return None
    assert type(result) in codec.TYPE_CODES
    return result


@MANY
@given(any_message, st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
       st.integers(-64, 64))
def test_mutated_frames_of_every_type(message, flips, resize):
    data = bytearray(codec.encode(message))
    for position, byte in flips:
        data[position % len(data)] = byte
    data = data[:len(data) + resize] if resize < 0 else data + bytes(resize)
    decodes_cleanly(bytes(data))


@MANY
@given(any_message, st.data(), values)
def test_one_field_replaced_by_anything(message, data, value):
    body = to_plain(message)
    field = data.draw(st.sampled_from(sorted(body)))
    body[field] = value
    frame = msgpack.packb({"v": list(PROTOCOL_VERSION), "t": codec.TYPE_CODES[type(message)], "b": body},
                          use_bin_type=True)
    result = decodes_cleanly(frame)
    assert result is None or type(result) is type(message)


@MANY
@given(st.sampled_from(sorted(codec.TYPES_BY_CODE)) | st.integers(-(2**63), 2**63 - 1), values, values, values)
def test_random_envelopes(code, body, version, extra):
    for v in (list(PROTOCOL_VERSION), version):
        decodes_cleanly(msgpack.packb({"v": v, "t": code, "b": body, "x": extra}, use_bin_type=True))


@st.composite
def chunk_streams(draw):
    """Chunk sequences that are mostly consistent, with one kind of damage now and then."""
    dtype = draw(st.sampled_from(["float32", "uint8", "float16"]))
    shape = tuple(draw(st.lists(st.integers(0, 40), min_size=1, max_size=3)))
    size = {"float32": 4, "uint8": 1, "float16": 2}[dtype]
    total = size
    for d in shape:
        total *= d
    count = draw(st.integers(1, 5))
    step = -(-total // count) if total else 0
    stream = []
    for i in range(count):
        data = bytes(min(step, max(0, total - i * step)))
        fields = dict(dtype=dtype, shape=shape, index=i, count=count, total_bytes=total, data=data)
        if draw(st.integers(0, 9)) == 0:
            name = draw(st.sampled_from(sorted(fields)))
            fields[name] = draw(st.integers(-3, 10**7) if name != "data" else st.binary(max_size=64))
        stream.append(fields)
    return stream


@SOME
@given(chunk_streams(), st.integers(0, 3))
def test_chunk_reassembly_never_exceeds_its_limit(stream, drop):
    limit = 4000
    assembler = ChunkAssembler(limit)
    for i, fields in enumerate(stream):
        if drop and i == drop:
            continue
        try:
            chunk = TensorChunk(**fields)
            payload = assembler.add(chunk)
        except (ProtocolError, TypeError):
            continue  # a damaged chunk is refused; the assembler stays as it was
        assert assembler.buffered_bytes <= limit
        if payload is not None:
            assert payload.nbytes == fields["total_bytes"] <= limit
            break


@SOME
@given(st.sampled_from(["float32", "float16", "bfloat16", "int64", "uint8", "bool", "float64"]),
       st.lists(st.integers(0, 9), max_size=4), st.booleans())
def test_tensor_decoder_rejects_wrong_shapes_and_dtypes(dtype, shape, poison):
    n = 1
    for d in shape:
        n *= d
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "uint8": 1, "bool": 1, "float64": 8}[dtype]
    raw = bytearray(n * itemsize)
    if poison and dtype in ("float32", "float64") and n:
        raw[-itemsize:] = (b"\xff" * itemsize)  # NaN
    payload = TensorPayload(dtype, tuple(shape), bytes(raw))
    expect = (2, 3, 4)
    try:
        tensor = tensor_codec.decode(payload, expect_shape=expect, expect_dtype=("float32", "float16", "bfloat16"),
                                     cast_to=torch.float32, what="fuzz")
    except BadTensor:
        return
    assert tuple(tensor.shape) == expect and tensor.dtype == torch.float32
