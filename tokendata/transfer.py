"""Dataset files over hivemind P2P: the coordinator (and every peer holding the run's dataset)
serves them; a volunteer without data of its own downloads what it needs, in chunks, each file
checked against the manifest's sha256 before it is used.

One binary stream per request (our own length-prefixed frames, sizes checked before reading),
like the pipeline's transport; a holder serves only the files its manifest lists, never a
path. Every request has a deadline; a download tries each holder in turn, a bounded number of
rounds.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Callable, Sequence

from protocol import codec
from protocol import messages as m
from protocol.errors import ErrorCode, ProtocolError

logger = logging.getLogger(__name__)
PROTOCOL_NAME = "skippipe.data.v1"
MAX_FRAME_BYTES = m.DATA_CHUNK_BYTES + 4096
REQUEST_TIMEOUT_S = 20.0
MAX_CONCURRENT = 8                  # requests a holder serves at once; more wait their turn


class TransferError(Exception):
    """A download failed: no holder answered, a file did not match its hash, or the disk refused."""


async def _write_frame(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(len(data).to_bytes(4, "big") + data)
    await writer.drain()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    length = int.from_bytes(await reader.readexactly(4), "big")
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {length} bytes is over the limit of {MAX_FRAME_BYTES}")
    return await reader.readexactly(length)


class DataServer:
    """Serves the files of one dataset folder: `files` maps each servable name to its path."""

    def __init__(self, dataset_id: str, files: dict[str, Path]):
        self.dataset_id, self.files = dataset_id, dict(files)
        self.served_bytes = 0
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)

    def answer(self, request: m.DataRequest) -> m.DataReply | m.ErrorReply:
        if request.dataset_id != self.dataset_id:
            return m.ErrorReply(ErrorCode.NOT_FOUND, f"we hold dataset {self.dataset_id}, not {request.dataset_id}")
        path = self.files.get(request.file)
        if path is None:
            return m.ErrorReply(ErrorCode.NOT_FOUND, f"dataset {self.dataset_id} has no file {request.file!r}")
        with open(path, "rb") as f:
            total = os.fstat(f.fileno()).st_size
            f.seek(min(request.offset, total))
            data = f.read(request.length)
        self.served_bytes += len(data)
        return m.DataReply(data, total)

    async def attach(self, p2p) -> None:
        async def on_stream(info, reader, writer):
            try:
                async with self._slots, asyncio.timeout(REQUEST_TIMEOUT_S):
                    try:
                        request = codec.decode(await _read_frame(reader), expected=m.DataRequest)
                        reply = await asyncio.to_thread(self.answer, request)
                    except ProtocolError as exc:
                        reply = m.ErrorReply(exc.code, str(exc))
                    await _write_frame(writer, codec.encode(reply))
            except Exception as exc:  # a broken stream from a remote never takes us down
                logger.debug("data request from %s failed: %s", info.peer_id, exc)
            finally:
                writer.close()

        await p2p.add_binary_stream_handler(PROTOCOL_NAME, on_stream)


async def fetch_chunk(p2p, holder: str, request: m.DataRequest, timeout: float = REQUEST_TIMEOUT_S) -> m.DataReply:
    from hivemind.p2p import PeerID
    writer = None
    try:
        async with asyncio.timeout(timeout):
            _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(holder), PROTOCOL_NAME)
            await _write_frame(writer, codec.encode(request))
            reply = codec.decode(await _read_frame(reader), max_bytes=MAX_FRAME_BYTES)
    except TimeoutError:
        raise TransferError(f"{holder[:12]} did not answer within {timeout:.0f}s") from None
    except ProtocolError as exc:
        raise TransferError(f"{holder[:12]} sent a bad reply: {exc}") from None
    except Exception as exc:  # p2pd dial failures come as various types
        raise TransferError(f"{holder[:12]}: {type(exc).__name__}: {exc}") from None
    finally:
        if writer is not None:
            writer.close()
    if isinstance(reply, m.ErrorReply):
        raise TransferError(f"{holder[:12]} refused: {reply.message}")
    if not isinstance(reply, m.DataReply):
        raise TransferError(f"{holder[:12]} answered with a {type(reply).__name__}")
    return reply


class Downloader:
    """Downloads files of one dataset from any of `holders`, into `folder`."""

    def __init__(self, p2p, dataset_id: str, holders: Sequence[str], folder: Path,
                 progress: Callable[[str], None] = lambda line: logger.info("%s", line), rounds: int = 3):
        self.p2p, self.dataset_id, self.holders = p2p, dataset_id, list(holders)
        self.folder, self.progress, self.rounds = Path(folder), progress, rounds

    async def fetch_bytes(self, name: str, max_bytes: int) -> bytes:
        """A small file (the manifest) whole, into memory."""
        data = bytearray()
        async for chunk in self._chunks(name, max_bytes):
            data += chunk
        return bytes(data)

    async def fetch_file(self, name: str, sha256: str, size: int) -> Path:
        """`name` into the folder (kept if already there with the right hash)."""
        target = self.folder / name
        if target.exists() and target.stat().st_size == size and await asyncio.to_thread(_sha256, target) == sha256:
            return target
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{name}.part{os.getpid()}")
        digest, done, t0, shown = hashlib.sha256(), 0, time.monotonic(), 0.0
        try:
            with open(tmp, "wb") as out:
                async for chunk in self._chunks(name, size):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if time.monotonic() - shown > 2.0 or done == size:
                        shown = time.monotonic()
                        rate = done / max(shown - t0, 1e-6) / 2**20
                        self.progress(f"downloading {name}: {done / 2**20:.1f} / {size / 2**20:.1f} MiB "
                                      f"({100 * done // max(size, 1)}%, {rate:.1f} MiB/s)")
            if done != size or digest.hexdigest() != sha256:
                raise TransferError(f"{name}: got {done} bytes with sha256 {digest.hexdigest()[:12]}, the manifest "
                                    f"says {size} bytes and {sha256[:12]}; refusing it")
            os.replace(tmp, target)
        except OSError as exc:
            raise TransferError(f"cannot write {target}: {exc.strerror or exc}") from None
        finally:
            tmp.unlink(missing_ok=True)
        return target

    async def _chunks(self, name: str, max_bytes: int):
        offset, total = 0, None
        while total is None or offset < total:
            reply = await self._one(m.DataRequest(self.dataset_id, name, offset))
            if total is None:
                total = reply.total_bytes
                if total > max_bytes:
                    raise TransferError(f"{name} is {total} bytes, more than the {max_bytes} expected")
            elif reply.total_bytes != total:
                raise TransferError(f"{name} changed size during the download")
            if not reply.data and offset < total:
                raise TransferError(f"{name}: an empty chunk at {offset} of {total}")
            offset += len(reply.data)
            yield reply.data

    async def _one(self, request: m.DataRequest) -> m.DataReply:
        errors = []
        for _ in range(self.rounds):
            for holder in self.holders:
                try:
                    return await fetch_chunk(self.p2p, holder, request)
                except TransferError as exc:
                    errors.append(str(exc))
            await asyncio.sleep(1.0)
        raise TransferError(f"no holder of dataset {self.dataset_id} served {request.file}: {errors[-1] if errors else 'no holders'}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
