"""The work: a `Target` is one array in the cache and one tensor on the device; a `Plan` is every target of a
conversion. Plain values that the stage functions take; `pipeline/model/recipe.py` makes them from configs/recipes.toml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

from tasks.numerics.precision import stored_dtype

HOST = "HOST"  # the layout of host-only targets: kept on the host as float32, never uploaded


@dataclass(frozen=True)
class HostTable:
    """A host table (q_norm, k_norm, embed_tokens) left in its shard until the stage writes it: it is streamed into
    the entry as the float32 the port keeps (`.to(torch.float32)`), block by block, so an F32 embed_tokens (1.24 GB)
    is never whole in memory. What the read task hands on for a host target; the stage reads it through
    tasks/source/shards.py `read_host_table`, checking it as it writes it."""
    header: Any  # its shard's ShardHeader (tasks/source/safetensors_file.py), a floor above: named, not imported
    key: str
    dtype = np.dtype(np.float32)  # what it is stored and handed out as

    @property
    def shape(self) -> tuple[int, ...]:
        return self.header.entries[self.key].shape

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True, kw_only=True)
class Target:
    """One array in the cache and one tensor on the device (or, with layout HOST, one float32 host tensor)."""

    name: str                  # e.g. vision.encoder.layers.5.self_attn.qkv_padded.weight
    sources: tuple[str, ...]   # checkpoint keys, in concatenation order
    transform: str
    kind: str                  # matmul | bias | norm | table | host
    device_dtype: str          # bfloat16 | bfloat8_b | bfloat4_b | float32 (host)
    device_layout: str         # TILE | ROW_MAJOR | HOST (Plan.layout is the name of the whole target layout)
    shape: tuple[int, ...]     # logical shape of one target (one slot for embodiment banks)
    embodiment: bool = False   # stored as [bank_slots, *shape], one chunk per slot
    device_file: bool = False  # keep ttnn's .tensorbin of it too (packed dtypes always do)
    min_pcc: float = 1.0       # recipes.toml [min_pcc]: below it, the conversion fails
    params: tuple[int, ...] = ()  # (heads, head_dim, padded_head_dim) of a head-padding transform
    bank_slots: int = 0        # slots in the source bank (embodiment targets)
    mirrors: str = ""          # the consumer's file@commit and function this target reproduces
    unit: str = ""             # the layer, block or module its first source belongs to: one ("unit", ...) task each
    source_dtypes: tuple[str, ...] = ()  # each source's safetensors dtype (precision.source_dtypes: () means BF16)

    @property
    def host(self) -> bool:
        return self.device_layout == HOST

    @property
    def stored_dtype(self) -> str:
        """What the cache stores it as: bfloat16, or float32 for a host table (as the port keeps it)."""
        return stored_dtype(self.host)


@dataclass(frozen=True, kw_only=True)
class Plan:
    version: str
    profile: str
    targets: tuple[Target, ...]
    skipped: Mapping[str, str]  # key -> reason
    layout: str = "generic"


def work_units(targets: tuple[Target, ...] | list[Target], slots: tuple[int, ...]) -> Iterator[tuple[Target, int | None]]:
    """Every (target, slot) the conversion makes: one per embodiment slot for a bank, else (target, None)."""
    for t in targets:
        for slot in (slots if t.embodiment else (None,)):
            yield t, slot
