"""Source tensors -> target tensors. Pure numpy; no I/O, no Dask.

Linear weights are stored `[out, in]` and used on the device as `x @ W` with `W [in, out]`, hence the transposes.
Embodiment banks are already `[slots, in, out]` and used as `x @ W[e] + b[e]`: a slot is never transposed.

The head-padding transforms take `(heads, head_dim, padded_head_dim)`: each head's `head_dim` rows (of a q/k/v
projection's output) or columns (of an output projection's input) are followed by zeros up to `padded_head_dim`,
so that heads are tile-aligned on the device (the tt-metal N1.6 port pads SigLIP2 72 -> 96 and DiT 48 -> 64). The
padding is on the bf16 values, before any tilizing or packing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from tasks.numerics import kernels
from tasks.io.bulk_write import aligned_empty  # outputs the cache writer hands to the disk without a copy

Shape = tuple[int, ...]


def identity(x: np.ndarray) -> np.ndarray:
    return x


def row(x: np.ndarray) -> np.ndarray:
    """`[n]` -> `[1, n]`: biases and norm weights as one row."""
    return x.reshape(1, -1)


BLOCK_ROWS = 256  # numpy's plain strided transpose runs at ~0.25 GB/s on 2-byte data; 256-row blocks at ~1.6


def _transpose_into(out: np.ndarray, x: np.ndarray) -> None:
    """`out[:] = x.T`: in C (tasks/numerics/kernels.c: 6-12 GB/s on the N1.6 shapes against ~1 for the numpy blocks
    below), else in numpy row blocks that stay in cache."""
    if kernels.available() and x.ndim == 2 and x.dtype.itemsize == 2 and x.dtype == out.dtype:
        kernels.transpose_into(out, x)
        return
    for i in range(0, x.shape[0], BLOCK_ROWS):
        out[:, i:i + BLOCK_ROWS] = x[i:i + BLOCK_ROWS].T


def fuse_transpose(*xs: np.ndarray) -> np.ndarray:
    """`[out_i, in]`... -> `[in, sum(out_i)]`: one matmul instead of several (q|k|v, k|v). Each source is
    transposed straight into its columns; nothing is concatenated first."""
    out = aligned_empty((xs[0].shape[1], sum(x.shape[0] for x in xs)), xs[0].dtype)
    col = 0
    for x in xs:
        _transpose_into(out[:, col:col + x.shape[0]], x)
        col += x.shape[0]
    return out


def transpose(x: np.ndarray) -> np.ndarray:
    """`[out, in]` -> `[in, out]`."""
    return fuse_transpose(x)


def flatten_transpose(x: np.ndarray) -> np.ndarray:
    """A conv/patch kernel `[out, c, (t,) kh, kw]` -> the matmul weight `[c*(t*)kh*kw, out]` of flattened patches."""
    return fuse_transpose(x.reshape(x.shape[0], -1))


def fuse_row(*xs: np.ndarray) -> np.ndarray:
    """`[out_i]`... -> `[1, sum(out_i)]`: the bias of a fused projection."""
    return np.concatenate(xs).reshape(1, -1)


def slot(x: np.ndarray) -> np.ndarray:
    """One embodiment slot `W[e]`, already `[in, out]`."""
    return x


def slot_row(x: np.ndarray) -> np.ndarray:
    """One embodiment bias `b[e]` `[out]` -> `[1, out]`."""
    return x.reshape(1, -1)


def unsqueeze(x: np.ndarray) -> np.ndarray:
    """`[N, D]` -> `[1, N, D]`: position tables as the port adds them to `[B, N, D]` activations."""
    return x.reshape(1, *x.shape)


def fuse_pad_heads_transpose(*xs: np.ndarray, heads: int, head_dim: int, padded: int) -> np.ndarray:
    """`[heads*head_dim, in]`... -> `[in, len(xs)*heads*padded]`: sections side by side (q|k|v), every head's
    columns zero-padded from head_dim to padded."""
    n_in = xs[0].shape[1]
    out = aligned_empty((n_in, len(xs) * heads * padded), xs[0].dtype, zeros=True)
    for i, x in enumerate(xs):
        for h in range(heads):
            col = (i * heads + h) * padded
            _transpose_into(out[:, col:col + head_dim], x[h * head_dim:(h + 1) * head_dim])
    return out


def pad_heads_transpose(x: np.ndarray, *, heads: int, head_dim: int, padded: int) -> np.ndarray:
    """One q, k or v projection: `[heads*head_dim, in]` -> `[in, heads*padded]`."""
    return fuse_pad_heads_transpose(x, heads=heads, head_dim=head_dim, padded=padded)


def fuse_pad_heads_row(*xs: np.ndarray, heads: int, head_dim: int, padded: int) -> np.ndarray:
    """Biases of padded projections: `[heads*head_dim]`... -> `[1, len(xs)*heads*padded]`."""
    out = np.zeros((len(xs), heads, padded), xs[0].dtype)
    for i, x in enumerate(xs):
        out[i, :, :head_dim] = x.reshape(heads, head_dim)
    return out.reshape(1, -1)


def pad_heads_row(x: np.ndarray, *, heads: int, head_dim: int, padded: int) -> np.ndarray:
    return fuse_pad_heads_row(x, heads=heads, head_dim=head_dim, padded=padded)


def pad_heads_in_transpose(x: np.ndarray, *, heads: int, head_dim: int, padded: int) -> np.ndarray:
    """An output projection reading padded heads: `[out, heads*head_dim]` -> `[heads*padded, out]`, the rows of
    every head's padding zero."""
    out = aligned_empty((heads * padded, x.shape[0]), x.dtype, zeros=True)
    for h in range(heads):
        _transpose_into(out[h * padded:h * padded + head_dim], x[:, h * head_dim:(h + 1) * head_dim])
    return out


@dataclass(frozen=True)
class Transform:
    """One transform the recipes may name: what it does, the shape it makes, and which dim it splits into heads.

    `shape(source_shapes, padded_width)` gives the target shape without touching data (`padded_width` =
    heads * padded_head_dim for a head-padding transform, else 0); `pads` is None, or the source dim (0: a q/k/v
    projection's output rows or a bias; 1: an output projection's input columns) that is `heads * head_dim`."""

    apply: Callable[..., np.ndarray]
    shape: Callable[[Sequence[Shape], int], Shape]
    pads: int | None = None


def _size(shape: Shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


TRANSFORMS: dict[str, Transform] = {
    "identity": Transform(identity, lambda s, w: s[0]),
    "row": Transform(row, lambda s, w: (1, _size(s[0]))),
    "transpose": Transform(transpose, lambda s, w: (s[0][1], s[0][0])),
    "flatten_transpose": Transform(flatten_transpose, lambda s, w: (_size(s[0][1:]), s[0][0])),
    "fuse_transpose": Transform(fuse_transpose, lambda s, w: (s[0][1], sum(x[0] for x in s))),
    "fuse_row": Transform(fuse_row, lambda s, w: (1, sum(_size(x) for x in s))),
    "slot": Transform(slot, lambda s, w: s[0][1:]),            # from the bank's shape: one slot
    "slot_row": Transform(slot_row, lambda s, w: (1, _size(s[0][1:]))),
    "unsqueeze": Transform(unsqueeze, lambda s, w: (1, *s[0])),
    "fuse_pad_heads_transpose": Transform(fuse_pad_heads_transpose, lambda s, w: (s[0][1], len(s) * w), pads=0),
    "pad_heads_transpose": Transform(pad_heads_transpose, lambda s, w: (s[0][1], w), pads=0),
    "fuse_pad_heads_row": Transform(fuse_pad_heads_row, lambda s, w: (1, len(s) * w), pads=0),
    "pad_heads_row": Transform(pad_heads_row, lambda s, w: (1, w), pads=0),
    "pad_heads_in_transpose": Transform(pad_heads_in_transpose, lambda s, w: (w, s[0][0]), pads=1),
}
PADDING = frozenset(n for n, t in TRANSFORMS.items() if t.pads is not None)  # take (heads, head_dim, padded)


def apply(name: str, sources: Sequence[np.ndarray], params: Sequence[int] = ()) -> np.ndarray:
    t = TRANSFORMS[name]
    if t.pads is None:
        return t.apply(*sources)
    heads, head_dim, padded = params
    return t.apply(*sources, heads=heads, head_dim=head_dim, padded=padded)


def output_shape(name: str, shapes: Sequence[Shape], params: Sequence[int] = ()) -> Shape:
    """The target shape a transform makes from source shapes (one slot for slot transforms). No data touched."""
    t = TRANSFORMS[name]
    return tuple(t.shape(shapes, params[0] * params[2] if t.pads is not None else 0))


def padded_dim(name: str, shapes: Sequence[Shape]) -> int | None:
    """The source dim a padding transform splits into heads (None for other transforms)."""
    t = TRANSFORMS[name]
    return None if t.pads is None else shapes[0][t.pads]
