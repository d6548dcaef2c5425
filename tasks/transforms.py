"""Source tensors -> target tensors, following tt-metal's weight conventions. Pure numpy; no I/O, no Dask.

Linear weights are stored `[out, in]` and used on the device as `x @ W` with `W [in, out]`, hence the transposes.
Embodiment banks are already `[slots, in, out]` and used as `x @ W[e] + b[e]`: a slot is never transposed.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

Shape = tuple[int, ...]


def identity(x: np.ndarray) -> np.ndarray:
    return x


def row(x: np.ndarray) -> np.ndarray:
    """`[n]` -> `[1, n]`: biases and norm weights as one row."""
    return x.reshape(1, -1)


BLOCK_ROWS = 256  # numpy's plain strided transpose runs at ~0.25 GB/s on 2-byte data; 256-row blocks at ~1.6


def _transpose_into(out: np.ndarray, x: np.ndarray) -> None:
    """`out[:] = x.T`, copied in row blocks that stay in cache."""
    for i in range(0, x.shape[0], BLOCK_ROWS):
        out[:, i:i + BLOCK_ROWS] = x[i:i + BLOCK_ROWS].T


def fuse_transpose(*xs: np.ndarray) -> np.ndarray:
    """`[out_i, in]`... -> `[in, sum(out_i)]`: one matmul instead of several (q|k|v, k|v). Each source is
    transposed straight into its columns; nothing is concatenated first."""
    out = np.empty((xs[0].shape[1], sum(x.shape[0] for x in xs)), xs[0].dtype)
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


TRANSFORMS: dict[str, Callable[..., np.ndarray]] = {
    f.__name__: f for f in (identity, row, transpose, flatten_transpose, fuse_transpose, fuse_row, slot, slot_row)
}


def apply(name: str, sources: Sequence[np.ndarray]) -> np.ndarray:
    return TRANSFORMS[name](*sources)


def output_shape(name: str, shapes: Sequence[Shape]) -> Shape:
    """The target shape a transform makes from source shapes (one slot for slot transforms). No data touched."""
    first = shapes[0]
    size = lambda s: int(np.prod(s, dtype=np.int64))  # noqa: E731
    table: dict[str, Callable[[], Shape]] = {
        "identity": lambda: first,
        "row": lambda: (1, size(first)),
        "transpose": lambda: (first[1], first[0]),
        "flatten_transpose": lambda: (size(first[1:]), first[0]),
        "fuse_transpose": lambda: (first[1], sum(s[0] for s in shapes)),
        "fuse_row": lambda: (1, sum(size(s) for s in shapes)),
        "slot": lambda: first[1:],
        "slot_row": lambda: (1, size(first[1:])),
    }
    return tuple(table[name]())
