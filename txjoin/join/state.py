"""The core's saved state: each object names the fields it saves, under one version.

A shard's snapshot (``Engine.state_bytes``) and each micro-batch's effects
(``ShardEngine`` in ``shard.py``) are built from these named fields only, never
from an object's attribute dictionary: an attribute added later is not saved by accident,
and a state that lacks a field is refused with what to do instead of restoring
half an engine. ``ENGINE_STATE_VERSION`` changes with the fields or their form; a
state this txjoin cannot convert changes ``state_log.py``'s layout version with it,
so an older checkpoint is refused before any of its state is read (version 2 is
converted as it is read: its outputs are rows and its snapshot identities whole
where version 3 packs them).
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from txjoin.errors import RECOVER, ConfigError

ENGINE_STATE_VERSION = 4
"""1: every object's attribute dictionary, pickled (up to layout 2); 2: named fields;
3: the join's last outputs packed as tuples (``TemporalJoin.pack``), the snapshot's
row identities as digests (``assembly.identity_digest``); 4: each assembler's incremental
snapshot rows (``sequence/incremental.py``)."""

READABLE_VERSIONS = (2, 3, 4)
"""Versions this txjoin restores: a version-2 state is converted as it is read; one of 2
or 3 has no incremental snapshot rows (txjoin refused them then)."""


CODEC = "lz4"
"""How a saved value's pickle is compressed (a shard's log entries, a spilled transaction's
chunks)."""
SIZE = struct.Struct("<Q")
"""The header of a packed value: its pickle's size, ahead of the compressed bytes."""


def pack(obj: Any) -> bytes:
    """``obj`` pickled and compressed behind its size (:func:`unpack` reads it)."""
    raw = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    return SIZE.pack(len(raw)) + pa.compress(raw, codec=CODEC, asbytes=True)


def unpack(blob: bytes | memoryview) -> Any:
    """The value :func:`pack` packed into ``blob``."""
    (size,) = SIZE.unpack_from(blob)
    return pickle.loads(pa.decompress(memoryview(blob)[SIZE.size:], size, codec=CODEC,
                                      asbytes=True))


def save_fields(obj: object, names: Iterable[str]) -> dict[str, Any]:
    """``obj``'s fields ``names`` by name (the values themselves, not copies)."""
    return {name: getattr(obj, name) for name in names}


def restore_fields(obj: object, state: Mapping[str, Any], names: Iterable[str]) -> None:
    """Set ``obj``'s fields ``names`` from ``state``; a missing one is a ConfigError."""
    names = tuple(names)
    missing = [name for name in names if name not in state]
    if missing:
        raise ConfigError(f"the checkpoint's saved {type(obj).__name__} state lacks "
                          f"{', '.join(missing)}: it was written by another txjoin version; "
                          f"{RECOVER}")
    for name in names:
        setattr(obj, name, state[name])


def check_version(version: object, where: str) -> None:
    """Refuse a state of another version, naming it and what to do."""
    if version not in READABLE_VERSIONS:
        raise ConfigError(f"{where}: the checkpoint's engine state has version {version}, this "
                          f"txjoin reads versions {', '.join(map(str, READABLE_VERSIONS[:-1]))} "
                          f"and {READABLE_VERSIONS[-1]}; "
                          f"{RECOVER}")
