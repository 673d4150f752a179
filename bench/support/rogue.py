"""A rogue swarm participant: malformed and malicious requests at real peers over hivemind P2P.

Used by tests/swarm/test_shared_swarm.py (as a subprocess, through bench/support/soak.py) and
bench/hostile.py. Every request is bounded in time; the process only talks to the addresses it
is given (127.0.0.1 in tests).

    python -m bench.support.rogue --initial-peers MADDR --run NAME --duration S --rate R
prints `ROGUE sent=<n> replies=<n> no_reply=<n> kinds=<n> dht_forgeries=<n>` at the end.
"""
import argparse
import asyncio
import collections
import random
import struct
import sys
import time

import msgpack

from protocol import codec, ids
from protocol import messages as m
from protocol.adverts import PeerAdvert, PeerState
from protocol.errors import ProtocolError
from protocol.tensors import TensorChunk, TensorPayload
from protocol.version import PROTOCOL_VERSION

PROTOCOL_NAME = "skippipe.v1"   # peer/transport/hivemind_p2p.py
ACTIVATION = (2, 32, 64)         # the test swarms' microbatch shape (samples, seq_len, tiny dim)


class Request:
    """Frames to send (length-prefixed unless `raw`), and whether to hang up before the end."""

    def __init__(self, kind: str, frames: list[bytes], raw: bytes = b"", hang_up: bool = False):
        self.kind, self.frames, self.raw, self.hang_up = kind, frames, raw, hang_up


def _header(rng: random.Random, run: str) -> m.WorkHeader:
    return m.WorkHeader(run if rng.random() < 0.8 else "rogue-run", rng.randrange(0, 50),
                        rng.randrange(0, 30), rng.randrange(0, 20), rng.randrange(0, 4))


def _float_tensor(rng: random.Random, shape=ACTIVATION, poison: bool = False) -> TensorPayload:
    n = 1
    for d in shape:
        n *= d
    data = bytearray(rng.randbytes(4 * n)) if n < 65536 else bytearray(4 * n)
    if poison and n:
        data[0:4] = struct.pack("<f", float("nan") if rng.random() < 0.5 else float("inf"))
    return TensorPayload("float32", shape, bytes(data))


def _envelope(code, body, v=None) -> bytes:
    return msgpack.packb({"v": list(v or PROTOCOL_VERSION), "t": code, "b": body}, use_bin_type=True)


def make_request(rng: random.Random, run: str) -> Request:
    """One hostile request, of a kind drawn uniformly from KINDS."""
    kind = rng.choice(KINDS)
    return Request(kind, *_BUILDERS[kind](rng, run))


def _garbage(rng, run):
    return [rng.randbytes(rng.randrange(0, 4096))],


def _truncated(rng, run):
    frame = codec.encode(m.ForwardRequest(_header(rng, run), _float_tensor(rng)))
    return [frame[:rng.randrange(0, len(frame))]],


def _bit_flips(rng, run):
    frame = bytearray(codec.encode(m.ForwardRequest(_header(rng, run), _float_tensor(rng, (2, 4, 8)))))
    for _ in range(rng.randrange(1, 8)):
        frame[rng.randrange(len(frame))] = rng.randrange(256)
    return [bytes(frame)],


def _wrong_version(rng, run):
    return [_envelope(10, {}, v=[rng.randrange(2, 99), 0])],


def _unknown_type(rng, run):
    return [_envelope(rng.choice([0, 5, 99, 2**31, -1]), {"x": 1})],


def _reply_as_request(rng, run):
    return [codec.encode(rng.choice([m.ForwardReply(_header(rng, run)), m.Pong(1), m.GradientShareAck(3),
                                     m.ErrorReply(m.ErrorCode.INTERNAL, "x")]))],


def _record_as_request(rng, run):
    advert = PeerAdvert("QmRogue", PeerState.ONLINE, "cpu", 1, 0.1)
    return [codec.encode(advert)],


def _bad_shape(rng, run):
    shape = rng.choice([(2, 32, 32), (1, 1), (3, 32, 64), (0,), (2, 32, 65)])
    cls = rng.choice([m.ForwardRequest, m.BackwardRequest])
    return [codec.encode(cls(_header(rng, run), _float_tensor(rng, shape)))],


def _bad_dtype(rng, run):
    n = 2 * 32 * 64
    payload = rng.choice([TensorPayload("int64", ACTIVATION, bytes(8 * n)), TensorPayload("uint8", ACTIVATION, bytes(n)),
                          TensorPayload("bool", ACTIVATION, bytes(n))])
    return [codec.encode(m.ForwardRequest(_header(rng, run), payload))],


def _non_finite(rng, run):
    cls = rng.choice([m.ForwardRequest, m.BackwardRequest])
    return [codec.encode(cls(_header(rng, run), _float_tensor(rng, poison=True)))],


def _gradient_share(rng, run):
    share = m.GradientShare(run, rng.randrange(0, 9), rng.randrange(0, 9), rng.randrange(0, 4),
                            rng.randrange(0, 100), _float_tensor(rng, (rng.randrange(1, 500),), rng.random() < 0.5))
    return [codec.encode(share)],


def _oversized_declared(rng, run):
    # a length header far above the 4 MiB frame limit, then a few bytes: must be refused unread
    return [], struct.pack(">I", rng.choice([4 * 1024 * 1024 + 1, 2**31, 2**32 - 1])) + b"\x00" * 16


def _partial_stream(rng, run):
    # a stream head and the first chunk of a big tensor, then hang up (or stall: cut by timeouts)
    shape, total = (2, 32, 64 * 64), 2 * 32 * 64 * 64 * 4
    head = m.StreamHead(codec.encode(m.ForwardRequest(_header(rng, run), TensorPayload("uint8", (0,), b""))))
    chunk = TensorChunk("float32", shape, 0, 8, total, bytes(total // 8))
    return [codec.encode(head), codec.encode(m.StreamChunk(chunk))], b"", True


def _lying_stream(rng, run):
    shape, total = (4, 4), 64
    head = m.StreamHead(codec.encode(m.ForwardRequest(_header(rng, run), TensorPayload("uint8", (0,), b""))))
    chunks = [TensorChunk("float32", shape, 0, 2, total, bytes(40)),                       # too many bytes
              TensorChunk("float32", shape, rng.randrange(1, 2), 2, total, bytes(32))]    # or out of order
    return [codec.encode(head)] + [codec.encode(m.StreamChunk(c)) for c in rng.sample(chunks, 2)],


def _huge_stream_claim(rng, run):
    shape = (1024, 1024, 1024)  # 4 GiB declared: refused before any buffering
    head = m.StreamHead(codec.encode(m.ForwardRequest(_header(rng, run), TensorPayload("uint8", (0,), b""))))
    chunk = TensorChunk("float32", shape, 0, 2048, 4 * 1024**3, bytes(1024))
    return [codec.encode(head), codec.encode(m.StreamChunk(chunk))],


def _big_ping(rng, run):
    return [codec.encode(m.Ping(rng.randrange(2**62), bytes(rng.randrange(0, 3 * 1024 * 1024))))],


def _nested_bomb(rng, run):
    body: object = 0
    for _ in range(rng.randrange(50, 400)):
        body = [body]
    return [_envelope(10, {"header": body, "tensor": body})],


_BUILDERS = {f.__name__.lstrip("_"): f for f in (
    _garbage, _truncated, _bit_flips, _wrong_version, _unknown_type, _reply_as_request, _record_as_request,
    _bad_shape, _bad_dtype, _non_finite, _gradient_share, _oversized_declared, _partial_stream,
    _lying_stream, _huge_stream_claim, _big_ping, _nested_bomb)}
KINDS = sorted(_BUILDERS)


async def send(p2p, peer_id, request: Request, timeout: float = 5.0) -> bytes | None:
    """Send one hostile request; returns the reply frame, or None when there was none in time."""
    from hivemind.p2p import PeerID
    writer = None
    try:
        async with asyncio.timeout(timeout):
            _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), PROTOCOL_NAME)
            if request.raw:
                writer.write(request.raw)
            for frame in request.frames:
                writer.write(len(frame).to_bytes(4, "big") + frame)
            await writer.drain()
            if request.hang_up:
                return None
            length = int.from_bytes(await reader.readexactly(4), "big")
            return await reader.readexactly(min(length, 4 * 1024 * 1024))
    except Exception:  # a refused or reset stream is an expected answer to garbage
        return None
    finally:
        if writer is not None:
            writer.close()


def is_error_reply(frame: bytes | None) -> bool:
    try:
        return isinstance(codec.decode(frame), m.ErrorReply)
    except ProtocolError:
        return False


FORGED_SPEED = 1e-9  # marks forged adverts, so tests can look for them in the coordinator's view


async def forge_adverts(dht, run: str, victims: list[str]) -> int:
    """Try to overwrite victims' adverts and add unowned/forged ones; returns how many tried.
    (Our own node keeps what we store, so success is judged by what members see, not here.)"""
    from hivemind.dht.crypto import RSASignatureValidator
    from protocol.owner import peer_id_of_subkey
    own = RSASignatureValidator().local_public_key  # the process-wide key of our own DHT node
    tried = 0
    # (an advert for our own key's id would be genuine, not forged: open runs let anyone announce)
    for victim in [v for v in victims if v != peer_id_of_subkey(own)][:4]:
        fake = codec.encode(PeerAdvert(victim, PeerState.ONLINE, "cpu", 1, FORGED_SPEED, stage=0))
        for subkey in (victim, own, b"[owner:ssh-rsa AAAAB3NzaC1yc2E=]"):
            tried += 1
            try:
                async with asyncio.timeout(5.0):
                    await dht.store(ids.peers_key(run), fake, time.time() + 30, subkey=subkey, return_future=True)
            except Exception:
                pass
    return tried


LYING_LAYERS = 7  # the rogue's own (genuinely signed) advert claims a model the run does not have


async def announce_lying_advert(dht, run: str) -> int:
    """Announce the rogue itself, ONLINE, with a layer count the run spec contradicts (issue 24:
    one such advert froze all planning); returns 1 when stored."""
    from hivemind.dht.crypto import RSASignatureValidator
    from protocol.owner import peer_id_of_subkey
    own = RSASignatureValidator().local_public_key
    advert = PeerAdvert(peer_id_of_subkey(own), PeerState.ONLINE, "cpu", 1 << 30, 1e-3, num_layers=LYING_LAYERS,
                        activation_bytes_per_sample=1, param_bytes_per_layer=1, timestamp=time.time())
    try:
        async with asyncio.timeout(5.0):
            stored = await dht.store(ids.peers_key(run), codec.encode(advert), time.time() + 30, subkey=own,
                                     return_future=True)
    except Exception:
        return 0
    return int(bool(stored))


async def list_peers(dht, run: str) -> list[str]:
    from protocol.owner import peer_id_of_subkey
    try:
        async with asyncio.timeout(5.0):
            found = await dht.get(ids.peers_key(run), latest=True, return_future=True)
    except Exception:
        return []
    peers = []
    if found is not None and isinstance(found.value, dict):
        for subkey in found.value:
            try:
                peers.append(peer_id_of_subkey(subkey))
            except ValueError:
                pass
    return peers


async def run_rogue(initial_peers: list[str], run: str, duration_s: float, rate: float, count: int,
                    seed: int) -> collections.Counter:
    from hivemind import DHT
    from opsweb.dht_process import safe_for_large_calls
    from hivemind.dht.crypto import RSASignatureValidator
    rng = random.Random(seed)
    stats = collections.Counter()
    # the signature validator only lets us read members' signed records; it protects nothing here
    dht = safe_for_large_calls(DHT(start=True, initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                                   record_validators=[RSASignatureValidator()]))
    try:
        p2p = await dht.replicate_p2p()
        deadline = time.monotonic() + duration_s
        peers, next_forgery = [], 0.0
        while time.monotonic() < deadline and (not count or stats["sent"] < count):
            if not peers or time.monotonic() > next_forgery:
                peers = await list_peers(dht, run) or peers
                stats["dht_forgeries"] += await forge_adverts(dht, run, peers)
                stats["lying_adverts"] += await announce_lying_advert(dht, run)
                next_forgery = time.monotonic() + 10.0
                if not peers:
                    await asyncio.sleep(1.0)
                    continue
            started = time.monotonic()
            batch = [make_request(rng, run) for _ in range(8)]
            replies = await asyncio.gather(*(send(p2p, rng.choice(peers), r) for r in batch))
            for request, reply in zip(batch, replies):
                stats["sent"] += 1
                stats["replies" if reply is not None else "no_reply"] += 1
                stats[f"kind_{request.kind}"] += 1
            if rate:
                await asyncio.sleep(max(0.0, len(batch) / rate - (time.monotonic() - started)))
    finally:
        dht.shutdown()
    return stats


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="rogue")
    p.add_argument("--initial-peers", nargs="+", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--rate", type=float, default=50.0, help="requests per second (0: as fast as possible)")
    p.add_argument("--count", type=int, default=0, help="stop after this many requests (0: duration only)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    stats = asyncio.run(run_rogue(args.initial_peers, args.run, args.duration, args.rate, args.count, args.seed))
    kinds = sum(1 for k in stats if k.startswith("kind_"))
    print(f"ROGUE sent={stats['sent']} replies={stats['replies']} no_reply={stats['no_reply']} kinds={kinds} "
          f"dht_forgeries={stats['dht_forgeries']} lying_adverts={stats['lying_adverts']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
