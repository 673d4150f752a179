"""peer.compute.tensor_codec: torch tensors <-> torch-free TensorPayload."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from peer.compute.errors import BadTensor
from peer.compute.tensor_codec import TORCH_DTYPES, decode, encode
from protocol.errors import FieldError
from protocol.tensors import TensorPayload


@pytest.mark.parametrize("name", sorted(TORCH_DTYPES))
def test_round_trip_every_dtype(name):
    dtype = TORCH_DTYPES[name]
    t = (torch.randn(3, 4, 5) * 100).to(dtype)
    p = encode(t)
    assert p.dtype == name and p.shape == (3, 4, 5)
    back = decode(p, expect_shape=(3, 4, 5), expect_dtype=dtype)
    assert back.dtype == dtype and torch.equal(back, t)
    back.add_(1) if dtype != torch.bool else None      # writable, owns its memory


def test_little_endian_bytes_and_non_contiguous():
    assert encode(torch.tensor([1], dtype=torch.int32)).data == b"\x01\x00\x00\x00"
    assert encode(torch.tensor([1.0], dtype=torch.bfloat16)).data == b"\x80\x3f"
    t = torch.arange(12.0).view(3, 4).t()
    assert torch.equal(decode(encode(t)), t)
    assert decode(encode(torch.zeros(0, 7))).shape == (0, 7)


@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_compression(wire):
    t = torch.randn(4, 8)
    p = encode(t, wire_dtype=wire)
    assert p.dtype == wire and p.nbytes == t.numel() * 2
    back = decode(p, expect_dtype=("float32", wire), cast_to=torch.float32)
    assert back.dtype == torch.float32 and torch.allclose(back, t, rtol=1e-2, atol=1e-2)
    ints = torch.arange(5)
    assert encode(ints, wire_dtype=wire).dtype == "int64"   # only floats are compressed


def test_fp16_overflow_falls_back_to_full_precision():
    t = torch.tensor([1.0, 1e6])
    assert encode(t, wire_dtype="float16").dtype == "float32"
    assert encode(t, wire_dtype="bfloat16").dtype == "bfloat16"  # bf16 has float32's range


def test_decode_validates():
    p = encode(torch.zeros(2, 3))
    with pytest.raises(BadTensor, match="shape"):
        decode(p, expect_shape=(2, 4))
    with pytest.raises(BadTensor, match="shape"):
        decode(p, expect_shape=(2, 3, 1))
    assert decode(p, expect_shape=(None, 3)).shape == (2, 3)
    with pytest.raises(BadTensor, match="dtype"):
        decode(p, expect_dtype=torch.float16)
    with pytest.raises(BadTensor):
        decode(b"not a payload")
    with pytest.raises(FieldError):                      # size checked by the payload itself
        TensorPayload("float32", (2, 3), b"\x00" * 5)
    with pytest.raises(ValueError):
        encode(torch.zeros(2), wire_dtype="int8")
    with pytest.raises(BadTensor):
        encode(torch.zeros(2, dtype=torch.complex64))


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(0, 4), min_size=0, max_size=4),
       name=st.sampled_from(["float32", "bfloat16", "float16", "int64", "uint8"]))
def test_round_trip_property(shape, name):
    t = torch.randn(*shape).mul(50).to(TORCH_DTYPES[name]) if shape else torch.tensor(3.0).to(
        TORCH_DTYPES[name])
    assert torch.equal(decode(encode(t)), t)
