"""File checksums: sha256, and XXH3 for the large files a table save writes.

A digest string names its algorithm: ``"xxh3:<16 hex digits>"`` is XXH3's
64-bit hash (seed 0, the default secret) of the file's bytes, what
``xxhsum -H3`` prints; 64 bare hex digits are its sha256 (what every manifest
other than a table's ``table.json`` uses; a ``table.json`` may list either).
:func:`new_digest` starts the algorithm of a digest it is given, so a reader
checks a file with whichever algorithm its manifest names.

Why XXH3 for table files: they are the bulk of a checkpoint (6 GB at 100M
keys) and a load checks every byte as it streams by, on two cores shared with
the index and the row writes. ``python bench/load_parts.py --keys 10m`` hashes
the 0.6 GB of a 10M-key table in 0.44 s of one core with sha256, more than
putting its keys into the index takes (0.23-0.28 s), and in 0.04 s with XXH3
(the ``xxhash`` package, which releases the GIL while it hashes). The checksum guards
against torn writes, truncation and flipped bits, not against a forger, so a
non-cryptographic 64-bit hash is enough: a random change passes unnoticed with
probability about 2**-64.
"""

from __future__ import annotations

import hashlib
from typing import Any

import xxhash

XXH3 = "xxh3:"
_HEX = frozenset("0123456789abcdef")


class Xxh3:
    """Streaming XXH3-64 with the ``hashlib`` interface; ``hexdigest`` returns
    ``"xxh3:<16 hex digits>"``."""

    def __init__(self, data: Any = b"") -> None:
        self._h = xxhash.xxh3_64()
        self.update(data)

    def update(self, data: Any) -> None:
        """Add ``data`` (bytes or any C-contiguous buffer) to the hash."""
        self._h.update(data)

    def hexdigest(self) -> str:
        """``"xxh3:<16 hex digits>"`` of everything added so far."""
        return XXH3 + self._h.hexdigest()


def algorithm(digest: str) -> str:
    """The algorithm a digest string names: ``"xxh3"`` or ``"sha256"``."""
    return "xxh3" if digest.startswith(XXH3) else "sha256"


def new_digest(like: str | None = None, data: Any = b"") -> Any:
    """Start a hash of the algorithm ``like`` names: ``"xxh3"`` or an ``"xxh3:..."`` digest
    for XXH3; ``None``, ``"sha256"`` or a sha256 hex digest for sha256."""
    if like is not None and (like == "xxh3" or like.startswith(XXH3)):
        return Xxh3(data)
    return hashlib.sha256(data)


def is_digest(value: object) -> bool:
    """Whether ``value`` is a digest string: 64 hex digits (sha256) or ``xxh3:`` + 16."""
    if not isinstance(value, str):
        return False
    hexpart, want = (value[len(XXH3) :], 16) if value.startswith(XXH3) else (value, 64)
    return len(hexpart) == want and _HEX.issuperset(hexpart)
