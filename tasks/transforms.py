"""Source tensors -> target tensors. Pure numpy; no I/O, no Dask.

Linear weights are stored `[out, in]` and used on the device as `x @ W` with `W [in, out]`, hence the transposes.
Embodiment banks are already `[slots, in, out]` and used as `x @ W[e] + b[e]`: a slot is never transposed.

The head-padding transforms take `(heads, head_dim, padded_head_dim)`: each head's `head_dim` rows (of a q/k/v
projection's output) or columns (of an output projection's input) are followed by zeros up to `padded_head_dim`,
so that heads are tile-aligned on the device (the tt-metal N1.6 port pads SigLIP2 72 -> 96 and DiT 48 -> 64). The
padding is on the bf16 values, before any tilizing or packing.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from tasks import kernels
from tasks.bulk_write import aligned_empty  # outputs the cache writer hands to the disk without a copy

Shape = tuple[int, ...]


def identity(x: np.ndarray) -> np.ndarray:
    return x


def row(x: np.ndarray) -> np.ndarray:
    """`[n]` -> `[1, n]`: biases and norm weights as one row."""
    return x.reshape(1, -1)


BLOCK_ROWS = 256  # numpy's plain strided transpose runs at ~0.25 GB/s on 2-byte data; 256-row blocks at ~1.6


def _transpose_into(out: np.ndarray, x: np.ndarray) -> None:
    """`out[:] = x.T`: in C (tasks/kernels.c: 6-12 GB/s on the N1.6 shapes against ~1 for the numpy blocks
    below), else in numpy row blocks that stay in cache."""
    if kernels.available() and x.ndim == 2 and x.dtype.itemsize == 2:
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


TRANSFORMS: dict[str, Callable[..., np.ndarray]] = {
    f.__name__: f for f in (identity, row, transpose, flatten_transpose, fuse_transpose, fuse_row, slot, slot_row,
                            unsqueeze, fuse_pad_heads_transpose, pad_heads_transpose, fuse_pad_heads_row,
                            pad_heads_row, pad_heads_in_transpose)
}
PADDING = frozenset(n for n in TRANSFORMS if "pad_heads" in n)  # take (heads, head_dim, padded)


def _padding(params: Sequence[int]) -> dict[str, int]:
    heads, head_dim, padded = params
    return {"heads": heads, "head_dim": head_dim, "padded": padded}


def apply(name: str, sources: Sequence[np.ndarray], params: Sequence[int] = ()) -> np.ndarray:
    return TRANSFORMS[name](*sources, **(_padding(params) if name in PADDING else {}))


def output_shape(name: str, shapes: Sequence[Shape], params: Sequence[int] = ()) -> Shape:
    """The target shape a transform makes from source shapes (one slot for slot transforms). No data touched."""
    first = shapes[0]
    size = lambda s: int(np.prod(s, dtype=np.int64))  # noqa: E731
    padded = (params[0] * params[2]) if name in PADDING else 0
    table: dict[str, Callable[[], Shape]] = {
        "identity": lambda: first,
        "row": lambda: (1, size(first)),
        "transpose": lambda: (first[1], first[0]),
        "flatten_transpose": lambda: (size(first[1:]), first[0]),
        "fuse_transpose": lambda: (first[1], sum(s[0] for s in shapes)),
        "fuse_row": lambda: (1, sum(size(s) for s in shapes)),
        "slot": lambda: first[1:],
        "slot_row": lambda: (1, size(first[1:])),
        "unsqueeze": lambda: (1, *first),
        "fuse_pad_heads_transpose": lambda: (first[1], len(shapes) * padded),
        "pad_heads_transpose": lambda: (first[1], padded),
        "fuse_pad_heads_row": lambda: (1, len(shapes) * padded),
        "pad_heads_row": lambda: (1, padded),
        "pad_heads_in_transpose": lambda: (padded, first[0]),
    }
    return tuple(table[name]())


def padded_dim(name: str, shapes: Sequence[Shape]) -> int | None:
    """The source dim a padding transform splits into heads (None for other transforms): the output dim of q/k/v
    and their biases, the input dim of an output projection."""
    if name not in PADDING:
        return None
    return shapes[0][1] if name == "pad_heads_in_transpose" else shapes[0][0]
