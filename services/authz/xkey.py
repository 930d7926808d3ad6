"""Curve (x25519) nkeys and nats-io/nkeys' sealed boxes (`xkv1` + a random 24-byte nonce + NaCl's `crypto_box`): how
nats-server seals each auth callout request to us (`auth_callout { xkey }`), and we the answer back. Public keys are
base32 of the curve prefix byte, the 32-byte key and a CRC-16, like every nkey (they start with `X`)."""

import base64
import hashlib
from dataclasses import dataclass, field

import nkeys
from nacl.exceptions import CryptoError
from nacl.public import Box, PrivateKey, PublicKey
from nacl.utils import random

VERSION = b"xkv1"
NONCE_BYTES = Box.NONCE_SIZE
PREFIX_BYTE_CURVE = 23 << 3
"""Base32-encodes to `X…` (nkeys' PrefixByteCurve)."""


class SealError(ValueError):
    """Not a message sealed for this key by that sender, or not a curve public key."""


def encode_public(prefix: int, raw: bytes) -> str:
    """An nkey public key: base32 (unpadded) of prefix byte, key and CRC-16."""
    body = bytes([prefix]) + raw
    return base64.b32encode(body + nkeys.crc16_checksum(body)).rstrip(b"=").decode()


def decode_public(key: str, prefix: int) -> bytes:
    """The raw 32 bytes of an nkey public key of this kind; ValueError for anything else."""
    try:
        data = base64.b32decode(key + "=" * (-len(key) % 8))
    except ValueError as error:
        raise ValueError(f"not an nkey: {error}") from error
    body, checksum = data[:-2], data[-2:]
    if len(body) != 33 or body[0] != prefix or nkeys.crc16_checksum(body) != checksum:
        raise ValueError("not an nkey of the expected kind")
    return body[1:]


@dataclass(frozen=True)
class CurveKey:
    """Our side of the xkey exchange: a curve private key."""

    private: PrivateKey = field(repr=False)

    @classmethod
    def derived(cls, secret: bytes, purpose: bytes) -> "CurveKey":
        """A curve key derived from a secret we already keep (domain-separated by `purpose`): none more to store."""
        return cls(PrivateKey(hashlib.sha256(purpose + b"\0" + secret).digest()))

    @property
    def public_key(self) -> str:
        return encode_public(PREFIX_BYTE_CURVE, bytes(self.private.public_key))

    def seal(self, message: bytes, recipient: str) -> bytes:
        nonce = random(NONCE_BYTES)
        return VERSION + nonce + self._box(recipient).encrypt(message, nonce).ciphertext

    def open(self, sealed: bytes, sender: str) -> bytes:
        if not sealed.startswith(VERSION) or len(sealed) <= len(VERSION) + NONCE_BYTES:
            raise SealError("not an xkv1 sealed message")
        nonce = sealed[len(VERSION):len(VERSION) + NONCE_BYTES]
        try:
            return self._box(sender).decrypt(sealed[len(VERSION) + NONCE_BYTES:], nonce)
        except CryptoError as error:
            raise SealError("not sealed for this key by that sender") from error

    def _box(self, other: str) -> Box:
        try:
            return Box(self.private, PublicKey(decode_public(other, PREFIX_BYTE_CURVE)))
        except ValueError as error:
            raise SealError(f"{other[:60]!r} is not a curve public key") from error
