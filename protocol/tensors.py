"""Torch-free tensor payloads: raw little-endian bytes + dtype + shape, chunked for the wire.

Never pickle: a payload is plain bytes whose size must equal prod(shape) * itemsize.
"""
from dataclasses import dataclass

from protocol.errors import FieldError, TensorError

DTYPE_ITEMSIZE = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}
MAX_NDIM = 8
DEFAULT_CHUNK_BYTES = 2 * 1024 * 1024      # below hivemind's 4 MiB unary message limit
DEFAULT_MAX_TENSOR_BYTES = 1024 * 1024 * 1024


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass(frozen=True)
class TensorPayload:
    dtype: str
    shape: tuple[int, ...]
    data: bytes

    def __post_init__(self):
        check_header(self.dtype, self.shape)
        expected = _numel(self.shape) * DTYPE_ITEMSIZE[self.dtype]
        if len(self.data) != expected:
            raise FieldError("data", f"{len(self.data)} bytes, but dtype {self.dtype} and shape "
                                     f"{list(self.shape)} need {expected}")

    @property
    def nbytes(self) -> int:
        return len(self.data)


def check_header(dtype: str, shape: tuple[int, ...]) -> None:
    if dtype not in DTYPE_ITEMSIZE:
        raise FieldError("dtype", f"unsupported dtype {dtype!r}; one of {sorted(DTYPE_ITEMSIZE)}")
    if len(shape) > MAX_NDIM:
        raise FieldError("shape", f"{len(shape)} dimensions, at most {MAX_NDIM}")
    if any(d < 0 for d in shape):
        raise FieldError("shape", f"negative dimension in {list(shape)}")


@dataclass(frozen=True)
class TensorChunk:
    """Part `index` of `count` of one payload; all parts repeat the header."""

    dtype: str
    shape: tuple[int, ...]
    index: int
    count: int
    total_bytes: int
    data: bytes

    def __post_init__(self):
        check_header(self.dtype, self.shape)
        if not 0 <= self.index < self.count:
            raise FieldError("index", f"chunk {self.index} of {self.count}")
        if self.total_bytes != _numel(self.shape) * DTYPE_ITEMSIZE[self.dtype]:
            raise FieldError("total_bytes", "does not match dtype and shape")


def split_payload(payload: TensorPayload, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[TensorChunk]:
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    data = memoryview(payload.data)   # slices share the payload's memory: no copy per chunk
    count = max(1, -(-len(data) // chunk_bytes))
    return [TensorChunk(payload.dtype, payload.shape, i, count, len(data),
                        data[i * chunk_bytes:(i + 1) * chunk_bytes]) for i in range(count)]


class ChunkAssembler:
    """Joins chunks arriving in order; rejects inconsistent, out-of-order or oversized streams
    before buffering more than the declared (and capped) size. A rejected chunk leaves the
    assembler unchanged."""

    def __init__(self, max_total_bytes: int = DEFAULT_MAX_TENSOR_BYTES):
        self.max_total_bytes = max_total_bytes
        self._first: TensorChunk | None = None
        self._parts: list[bytes] = []   # joined once at the end: one copy of the tensor, not two
        self._received = 0
        self._next_index = 0

    @property
    def buffered_bytes(self) -> int:
        return self._received

    def add(self, chunk: TensorChunk) -> TensorPayload | None:
        """Add the next chunk; returns the payload once the last chunk is in."""
        first = self._first
        if first is None:
            if chunk.total_bytes > self.max_total_bytes:
                raise TensorError(f"tensor of {chunk.total_bytes} bytes exceeds the limit of "
                                  f"{self.max_total_bytes}")
            first = chunk
        elif (chunk.dtype, chunk.shape, chunk.count, chunk.total_bytes) != (
                first.dtype, first.shape, first.count, first.total_bytes):
            raise TensorError("chunk header differs from the first chunk of the stream")
        if chunk.index != self._next_index:
            raise TensorError(f"chunk {chunk.index} arrived, expected {self._next_index}")
        received = self._received + len(chunk.data)
        if received > first.total_bytes:
            raise TensorError("stream carries more bytes than its header declares")
        last = chunk.index + 1 == first.count
        if last and received != first.total_bytes:
            raise TensorError(f"stream ended with {received} of {first.total_bytes} bytes")
        self._first = first
        self._parts.append(chunk.data)
        self._received = received
        self._next_index += 1
        if not last:
            return None
        data, self._parts = b"".join(self._parts), []
        return TensorPayload(first.dtype, first.shape, data)
