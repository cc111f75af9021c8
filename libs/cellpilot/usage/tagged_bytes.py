"""The opening of the core's pickle-free byte formats: a four-byte magic, then a length.

Serialised histograms (``CPH1``), recommender states (``CPST``) and Autopilot array bundles
(``CPAB``) all start this way; :func:`read_tagged_length` checks the magic and returns the
length that follows it, so every reader rejects short or foreign bytes with the same words.
"""

from __future__ import annotations

import struct


def read_tagged_length(view: memoryview, header: struct.Struct, magic: bytes, what: str) -> int:
    """The length after ``magic`` at the start of ``view``, where ``header`` packs (magic, length).

    Raises ValueError naming ``what`` when ``view`` is shorter than the header or starts with
    another magic.
    """
    if len(view) < header.size:
        raise ValueError(f"truncated {what}")
    found, length = header.unpack_from(view, 0)
    if found != magic:
        raise ValueError(f"not a serialised {what} (bad magic)")
    return int(length)
