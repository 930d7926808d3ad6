"""An upper bound on a byte-level BPE token count from a text's bytes alone: one table look-up per byte and a sum, no
tokenizing (`PairBound`), for GPT-2's pre-tokenizer (`tokenizer.GPT2_SPLIT`) over a tiktoken vocabulary."""

import string
import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

LETTERS = string.ascii_letters.encode()
LEADER_CANDIDATES = LETTERS + b" "
APOSTROPHE = ord("'")
LETTER_WEIGHTS = dict(zip(b"etaoinshrdlcumwfgypbvkjxqz", (127, 91, 82, 75, 70, 67, 63, 61, 60, 43, 40, 28, 28, 24, 24,
                                                         22, 20, 20, 19, 15, 10, 8, 2, 2, 1, 1), strict=True))
"""How often English text has each letter (per 1,000 letters), and about a space every five: what the pairs are
chosen for (`PairBound.of`). The choice only makes the bound tighter or looser, never wrong."""
LETTER_WEIGHTS[ord(" ")] = 200
SUM_SPAN = 20_000
"""Bytes summed per Adler-32 (weights of at most 3 stay below its modulus, 65,521)."""
NO_TOKEN = 0xFF
"""What a byte the vocabulary has no token for weighs: a mark, not a weight (`PairBound.spoilt`)."""


@dataclass(frozen=True)
class PairBound:
    """`bound(data) >= ` the tokens tiktoken makes of `data` (the UTF-8 of an encodable text, special tokens allowed).

    Given leaders L (ASCII letters and the space) and followers F (ASCII letters) with every pair l+f a token of the
    vocabulary, and no special token that starts with a byte of F or ends with one of L:

    1. BPE leaves no two adjacent single-byte parts whose pair is a token (tiktoken merges until no adjacent pair's
       bytes are one), and never merges across pre-tokenizer pieces or special tokens.
    2. Call a position i a link when byte i-1 is in L, byte i in F, and both are in one piece (or one special token).
       At a link the two bytes are in one token, or in two tokens of which one is longer than a byte (1.). A token of
       k >= 2 bytes is charged its k-1 inner links and at most the 2 at its edges: k+1 <= 3(k-1). So links <= 3 x
       (bytes - tokens): tokens <= bytes - ceil(links / 3).
    3. Links from the bytes: every position i >= 1 whose byte is in F and follows one in L is a link, unless a piece
       or special token ends between them. In GPT-2's split a letter run is one piece (` ?\\p{L}+` is greedy), a space
       before a letter opens that letter's piece (the whitespace alternatives never end right before a letter), and
       only a contraction (`'s`, `'ll`...) ends a piece before a letter: at most one break per apostrophe. A special
       token never starts with a follower nor ends with a leader, so none ends between the two.
       Each byte not in L spoils the position after it, and byte 0 has none before it, so links >= bytes - 1 - the
       sum over bytes of w = [not in F] + [not in L] + [apostrophe]: one `bytes.translate` and an Adler-32 (whose
       low half is 1 + the bytes' sum)."""

    leaders: frozenset[int]
    followers: frozenset[int]
    missing: frozenset[int] = frozenset()
    """The byte values no token of the vocabulary is (the encoder cannot take a text holding one)."""
    weights: bytes = field(init=False)
    """w of each byte value (`NO_TOKEN` for a missing one)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", bytes(NO_TOKEN if b in self.missing else (b not in self.followers)
                                                  + (b not in self.leaders) + (b == APOSTROPHE) for b in range(256)))

    @classmethod
    def of(cls, ranks: Mapping[bytes, int], special: Collection[str]) -> "PairBound | None":
        """The pairs that suit English text best (a local search over the followers, the leaders all that pair with
        them), checked against the special tokens; None when no pair is safe."""
        leaders_of = {f: frozenset(x for x in LEADER_CANDIDATES if bytes([x, f]) in ranks) for f in LETTERS}

        def leaders(followers: frozenset[int]) -> frozenset[int]:
            return frozenset(LEADER_CANDIDATES).intersection(*(leaders_of[f] for f in followers))

        def score(followers: frozenset[int]) -> int:
            led = leaders(followers)
            return sum(weight * ((b in followers) + (b in led)) for b, weight in LETTER_WEIGHTS.items())

        followers = frozenset(string.ascii_lowercase.encode())
        while True:
            best = max((frozenset(followers ^ {f}) for f in LETTERS), key=score)
            if score(best) <= score(followers):
                break
            followers = best
        edges = [token.encode() for token in special if token]
        followers -= {token[0] for token in edges}
        led = leaders(followers) - {token[-1] for token in edges}
        if not followers or not led:
            return None
        missing = frozenset(byte for byte in range(256) if bytes([byte]) not in ranks)
        return cls(led, followers, missing)

    def __call__(self, data: bytes) -> int:
        """The bound of the text `data` (its own size when the vocabulary lacks one of its bytes)."""
        spoilt = self.spoilt(data)
        return self.within(len(data), spoilt) if spoilt is not None else len(data)

    def spoilt(self, data: bytes) -> int | None:
        """The sum of w over `data`'s bytes (which adds up over the parts of a text); None when the vocabulary lacks
        one of them (such a text is never given to the encoder, and has no bound but its size)."""
        weighed = data.translate(self.weights)
        if NO_TOKEN in weighed:
            return None
        if len(weighed) <= SUM_SPAN:
            return (zlib.adler32(weighed) & 0xFFFF) - 1
        view = memoryview(weighed)
        return sum((zlib.adler32(view[start:start + SUM_SPAN]) & 0xFFFF) - 1
                   for start in range(0, len(view), SUM_SPAN))

    @staticmethod
    def within(size: int, spoilt: int) -> int:
        """The bound of a text of `size` bytes whose w sum to `spoilt`."""
        links = size - 1 - spoilt
        return size - (links + 2) // 3 if links > 0 else size
