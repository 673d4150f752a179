"""Owned DHT subkeys: `[owner:ssh-rsa AAAA...]` and the libp2p peer id of that key.

A peer writes its records (advert, links, progress) under a subkey naming its RSA public key;
hivemind's RSASignatureValidator then accepts changes to that subkey only when signed with the
matching private key. The same RSA key is the peer's libp2p identity, so the peer id can be
recomputed from the subkey: a record whose `peer_id` differs from its owner's is forged.
Pure stdlib (the libp2p peer-id rule: sha2-256 multihash of the protobuf-encoded public key).
"""
import base64
import binascii
import hashlib
import re
import struct

OWNER_PREFIX = b"[owner:"
_OWNER_RE = re.compile(rb"\[owner:(ssh-rsa [A-Za-z0-9+/=]+)\]")
_RSA_OID = bytes.fromhex("06092a864886f70d0101010500")  # rsaEncryption + NULL parameters
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
MAX_KEY_BYTES = 2048


class BadOwnerKey(ValueError):
    """A subkey does not carry one well-formed RSA owner key."""


def owner_subkey(ssh_public_key: bytes) -> bytes:
    return OWNER_PREFIX + ssh_public_key + b"]"


def owner_key_of(subkey: object) -> bytes:
    """The `ssh-rsa ...` key inside an owned subkey; BadOwnerKey otherwise."""
    if not isinstance(subkey, (bytes, bytearray)) or len(subkey) > MAX_KEY_BYTES:
        raise BadOwnerKey("subkey is not an owner key")
    found = _OWNER_RE.fullmatch(bytes(subkey))
    if found is None:
        raise BadOwnerKey("subkey is not of the form [owner:ssh-rsa ...]")
    return found.group(1)


def peer_id_of_subkey(subkey: object) -> str:
    return peer_id_of_ssh_key(owner_key_of(subkey))


def peer_id_of_ssh_key(ssh_public_key: bytes) -> str:
    """The base58 libp2p peer id of an OpenSSH-format RSA public key."""
    exponent, modulus = _parse_ssh_rsa(ssh_public_key)
    rsa_key = _der(0x30, _der(0x02, modulus) + _der(0x02, exponent))
    spki = _der(0x30, _der(0x30, _RSA_OID) + _der(0x03, b"\x00" + rsa_key))
    proto = b"\x08\x00\x12" + _varint(len(spki)) + spki  # PublicKey{key_type: RSA, data: spki}
    return _base58(b"\x12\x20" + hashlib.sha256(proto).digest())


def _parse_ssh_rsa(text: bytes) -> tuple[bytes, bytes]:
    try:
        kind, blob_b64 = text.split(b" ")[:2]
        blob = base64.b64decode(blob_b64, validate=True)
    except (ValueError, binascii.Error):
        raise BadOwnerKey("owner key is not 'ssh-rsa <base64>'") from None
    fields, offset = [], 0
    for _ in range(3):
        if offset + 4 > len(blob):
            raise BadOwnerKey("owner key blob is truncated")
        (length,) = struct.unpack(">I", blob[offset:offset + 4])
        if offset + 4 + length > len(blob):
            raise BadOwnerKey("owner key blob is truncated")
        fields.append(blob[offset + 4:offset + 4 + length])
        offset += 4 + length
    if kind != b"ssh-rsa" or fields[0] != b"ssh-rsa" or not fields[1] or not fields[2]:
        raise BadOwnerKey("owner key is not an RSA key")
    return fields[1], fields[2]  # ssh mpints are already DER INTEGER contents


def _der(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        length = bytes([n])
    else:
        raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
        length = bytes([0x80 | len(raw)]) + raw
    return bytes([tag]) + length + content


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _base58(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\x00"))) + out
