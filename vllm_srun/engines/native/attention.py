"""Self-attention over packed rows: each row attends only to itself.

Projections and the MLP run on the packed tokens; attention regroups rows by length into a few
padded groups (`partition`), one attention call each, and scatters results back, so callers
never see the grouping. The small-batch path (`Block`) uses one right-padded block. Both take fused or
separate q/k/v, grouped key/value heads, causal and sliding-window masks, an additive
`PositionBias`, query-only tokens (`key_lengths`) and an accelerator's own SDPA kernel.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

# Grouping cost model, in attention-score cells (rows x width^2): one extra group (a handful of
# ops, each a parallel region) is worth about one 128-token row's scores, so typical batches get
# a few groups with little padding rather than one wide block or many tiny ones.
GROUP_COST_CELLS = 128 * 128
MAX_GROUP_ROWS = 32

# Called as torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=...) is.
AttentionKernel = Callable[..., Any]
# float32 and bfloat16 attention on the cpu whose scores ([rows, heads, width, width]) hold at
# most this many cells runs as two matmuls around a softmax instead of torch's SDPA, whose flash
# kernel for the CPU is slower on short rows; beyond about this size the scores leave the cache
# and the flash kernel wins (docs/performance.md, "float32 attention", "bfloat16 attention").
PLAIN_MAX_CELLS = 1 << 21
PLAIN_DTYPES = ("torch.float32", "torch.bfloat16")


def partition(lengths: list[int]) -> list[tuple[int, int]]:
    """Split rows sorted by length into consecutive [start, end) groups that minimise padded
    score cells plus GROUP_COST_CELLS per group (dynamic programming over the sorted rows)."""
    best = [0.0] + [float("inf")] * len(lengths)
    cut = [0] * (len(lengths) + 1)
    for end in range(1, len(lengths) + 1):
        width = lengths[end - 1]
        for start in range(max(0, end - MAX_GROUP_ROWS), end):
            cost = best[start] + (end - start) * width * width + GROUP_COST_CELLS
            if cost < best[end]:
                best[end], cut[end] = cost, start
    bounds, end = [], len(lengths)
    while end > 0:
        bounds.append((cut[end], end))
        end = cut[end]
    return bounds[::-1]


class PositionBias(Protocol):
    """An additive attention bias that depends on positions within a row (and perhaps on the
    queries and keys): called on each padded block, whose rows all start at position 0."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, width: int) -> torch.Tensor:
        """[rows or 1, heads, width, width] for `q`, `k` of shape [rows, heads, width, dim]."""
        ...


def _additive(allowed: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """0 where `allowed`, -inf elsewhere; None when everything is allowed.

    Additive rather than boolean: SDPA would convert a boolean mask on every call (two more
    ops per group and layer); this one is built once per batch.
    """
    if allowed is None:
        return None
    import torch

    zeros = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return zeros.masked_fill(~allowed, float("-inf"))


def _band(width: int, window: int | None, causal: bool, device: torch.device) -> torch.Tensor | None:
    """[width, width] bool: which key (column) each query (row) may see by position alone."""
    import torch

    allowed = None
    idx = torch.arange(width, device=device)
    if window is not None and width - 1 > window:
        allowed = (idx[:, None] - idx[None, :]).abs() <= window
    if causal and width > 1:
        lower = idx[None, :] <= idx[:, None]
        allowed = lower if allowed is None else allowed & lower
    return allowed


MaskKey = tuple[int | None, bool, "torch.dtype"]


@dataclass
class _Group:
    """Rows padded into one [rows, width] block; `gather` maps each cell to a packed token."""

    rows: int
    width: int
    gather: torch.Tensor  # [rows * width]; padding cells repeat a real token (they are masked)
    valid: torch.Tensor  # [rows, width] bool
    cells: tuple[torch.Tensor, torch.Tensor] | None  # (row, column) of each real cell; None: no padding
    masks: dict[MaskKey, torch.Tensor | None] = field(default_factory=dict)
    keys: torch.Tensor | None = None  # [rows, width] bool, the cells attended to; None: the valid ones

    def mask(self, window: int | None, dtype: torch.dtype, causal: bool = False) -> torch.Tensor | None:
        """Additive SDPA mask (0 or -inf) for this block, None when every cell may see every other."""
        key = (window, causal, dtype)
        if key not in self.masks:
            allowed = None
            if self.keys is not None:
                allowed = self.keys[:, None, None, :]
            elif self.cells is not None:
                allowed = self.valid[:, None, None, :]
            band = _band(self.width, window, causal, self.valid.device)
            if band is not None:
                allowed = band if allowed is None else allowed & band
            self.masks[key] = _additive(allowed, dtype)
        return self.masks[key]


def _sdpa_call(
    sdpa: AttentionKernel,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    bias: PositionBias | None,
    scale: float | None,
) -> torch.Tensor:
    """One attention call on [rows, heads, width, dim] blocks; k and v may have fewer heads."""
    if k.shape[1] != q.shape[1]:  # grouped key/value heads: each serves heads // kv_heads queries
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    if bias is not None:
        extra = bias(q, k, q.shape[2]).to(q.dtype)
        mask = extra if mask is None else extra + mask
    if sdpa is _torch_sdpa() and _plain_fits(q, k):
        return _plain_attention(q, k, v, mask, scale)
    if scale is None:
        return sdpa(q, k, v, attn_mask=mask)  # type: ignore[no-any-return]
    return sdpa(q, k, v, attn_mask=mask, scale=scale)  # type: ignore[no-any-return]


def _torch_sdpa() -> AttentionKernel:
    import torch.nn.functional as F

    return F.scaled_dot_product_attention


def _plain_fits(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether attention of these blocks runs as `_plain_attention` (PLAIN_DTYPES, PLAIN_MAX_CELLS)."""
    cells = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]
    return str(q.dtype) in PLAIN_DTYPES and q.device.type == "cpu" and cells <= PLAIN_MAX_CELLS


def _plain_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float | None
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v, as SDPA computes it, in three ops on one scores tensor.

    In bfloat16 both products take bfloat16 operands and sum in float32, each rounding its
    output to bfloat16; the scaling, the mask and the softmax run in float32.
    """
    import torch

    scores = torch.matmul(q, k.transpose(-1, -2)).float()
    scores.mul_(q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        scores.add_(mask)
    return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)


@dataclass
class Segments:
    """Where each packed row starts and ends, per-token positions (restarting at 0 each row),
    and the padded groups attention runs on (built once per batch, shared by all layers)."""

    starts: list[int]
    lengths: list[int]
    positions: torch.Tensor
    row_ids: torch.Tensor
    attention: AttentionKernel | None = None  # an accelerator's kernel; None: torch's SDPA
    key_lengths: list[int] | None = None  # per row, how many leading tokens are keys; None: all
    _groups: list[_Group] | None = None
    _tokens: torch.Tensor | None = None  # packed position of every real cell, group after group

    @classmethod
    def from_offsets(
        cls,
        offsets: np.ndarray,
        device: torch.device,
        *,
        attention: AttentionKernel | None = None,
        key_lengths: np.ndarray | None = None,
    ) -> Segments:
        """Segments of packed rows; `key_lengths` (per row, at most its length) limits the keys
        of each row to its first so many tokens."""
        import torch

        bounds = [int(x) for x in offsets]
        lengths = [b - a for a, b in itertools.pairwise(bounds)]
        ends = np.asarray(bounds[1:], dtype=np.int64)
        row_ids = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        positions = np.arange(bounds[-1], dtype=np.int64) - np.repeat(ends - lengths, lengths)
        return cls(
            starts=bounds[:-1],
            lengths=lengths,
            positions=torch.as_tensor(positions, device=device),
            row_ids=torch.as_tensor(row_ids, device=device),
            attention=attention,
            key_lengths=None if key_lengths is None else [int(k) for k in key_lengths],
        )

    def groups(self) -> tuple[list[_Group], torch.Tensor]:
        """The padded attention groups and, for their real cells in order, the packed positions."""
        if self._groups is None or self._tokens is None:
            self._groups, self._tokens = self._build_groups()
        return self._groups, self._tokens

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None = None,
        v: torch.Tensor | None = None,
        *,
        window: int | None = None,
        causal: bool = False,
        bias: PositionBias | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Attention of every packed row over its own tokens; returns [tokens, heads * dim].

        Either `q` is the fused [tokens, 3, heads, dim] projection (one gather for all three),
        or `q` [tokens, heads, dim] with `k`, `v` [tokens, kv_heads, dim]. `window` limits a
        query to keys at most that many positions away; `causal` to keys at or before it;
        `bias` adds a position bias per block; `scale` replaces 1/sqrt(dim).
        """
        import torch
        import torch.nn.functional as F

        sdpa = self.attention or F.scaled_dot_product_attention
        groups, positions = self.groups()
        fused = k is None
        tokens, heads, head_dim = q.shape[0], q.shape[-2], q.shape[-1]
        blocks = []
        for g in groups:
            if fused:
                # One gather for q, k and v: [rows, width, 3, heads, dim] -> 3 x [rows, heads, width, dim]
                qb, kb, vb = (
                    q.index_select(0, g.gather)
                    .view(g.rows, g.width, 3, heads, head_dim)
                    .permute(2, 0, 3, 1, 4)
                )
            else:
                assert k is not None and v is not None
                qb, kb, vb = (
                    t.index_select(0, g.gather).view(g.rows, g.width, t.shape[1], t.shape[2]).transpose(1, 2)
                    for t in (q, k, v)
                )
            block = _sdpa_call(sdpa, qb, kb, vb, g.mask(window, q.dtype, causal), bias, scale)
            block = block.transpose(1, 2)
            blocks.append(block.reshape(-1, heads, head_dim) if g.cells is None else block[g.cells])
        out = q.new_empty(tokens, heads, head_dim)
        out.index_copy_(0, positions, blocks[0] if len(blocks) == 1 else torch.cat(blocks))
        return out.view(tokens, heads * head_dim)

    def _build_groups(self) -> tuple[list[_Group], torch.Tensor]:
        import torch

        device = self.positions.device
        order = sorted(range(len(self.lengths)), key=lambda r: self.lengths[r])
        groups, tokens = [], []
        for first, last in partition([self.lengths[r] for r in order]):
            rows = order[first:last]
            width = self.lengths[rows[-1]]
            gather = np.empty((len(rows), width), dtype=np.int64)
            valid = np.zeros((len(rows), width), dtype=bool)
            for j, r in enumerate(rows):
                n = self.lengths[r]
                gather[j, :n] = np.arange(self.starts[r], self.starts[r] + n)
                gather[j, n:] = self.starts[r]
                valid[j, :n] = True
            tokens.append(gather[valid])
            cells = None
            if not valid.all():
                cells = tuple(torch.as_tensor(c, device=device) for c in np.nonzero(valid))
            groups.append(
                _Group(
                    rows=len(rows),
                    width=width,
                    gather=torch.as_tensor(gather.reshape(-1), device=device),
                    valid=torch.as_tensor(valid, device=device),
                    cells=cells,  # type: ignore[arg-type]
                    keys=self._group_keys(rows, width, device),
                )
            )
        return groups, torch.as_tensor(np.concatenate(tokens), device=device)

    def _group_keys(self, rows: list[int], width: int, device: torch.device) -> torch.Tensor | None:
        """The key cells of a group's rows, None where every real token of them is a key."""
        if self.key_lengths is None or all(self.key_lengths[r] >= self.lengths[r] for r in rows):
            return None
        import torch

        counts = np.asarray([self.key_lengths[r] for r in rows])
        return torch.as_tensor(np.arange(width)[None, :] < counts[:, None], device=device)


class Block:
    """Rows laid out as one right-padded [rows, width] block, flattened to [rows * width]
    tokens: the small-batch layout. Layers run on it exactly as on `Segments`; attention runs once
    per layer on a view of the projections, masked only where rows are padded."""

    def __init__(
        self,
        lengths: np.ndarray,
        device: torch.device,
        *,
        attention: AttentionKernel | None = None,
        key_lengths: np.ndarray | None = None,
    ) -> None:
        import torch

        self.rows, self.width = len(lengths), int(lengths.max())
        self.valid = torch.as_tensor(np.arange(self.width)[None, :] < lengths[:, None], device=device)
        self.padded = int(lengths.min()) != self.width
        self.positions = torch.arange(self.width, device=device).repeat(self.rows)
        self.attention = attention
        self._masks: dict[MaskKey, torch.Tensor | None] = {}
        # The cells attended to, where some real token is not a key (see `Segments.from_offsets`).
        self.keys: torch.Tensor | None = None
        if key_lengths is not None and bool((key_lengths < lengths).any()):
            self.keys = torch.as_tensor(np.arange(self.width)[None, :] < key_lengths[:, None], device=device)

    @classmethod
    def traced(cls, valid: torch.Tensor) -> Block:
        """A block over a [rows, width] validity mask given as a tensor, every shape read from
        tensors, for export to a graph with dynamic rows and width (the small-batch ONNX path).
        Its key mask is always applied, with the float minimum rather than -inf."""
        import torch

        block = cls.__new__(cls)
        block.rows, block.width = valid.shape[0], valid.shape[1]
        block.valid = valid.bool()
        block.padded = True
        block.positions = torch.arange(valid.shape[1], device=valid.device).repeat(valid.shape[0])
        block.attention = None
        block.keys = None
        mask = (1.0 - valid[:, None, None, :].float()) * torch.finfo(torch.float32).min
        block._masks = {(None, False, torch.float32): mask}
        return block

    def scatter(self, packed: torch.Tensor) -> torch.Tensor:
        """Packed per-token values [tokens, ...] laid into the block [rows * width, ...] (zeros
        in the padding)."""
        if not self.padded:
            return packed
        flat = self.valid.reshape(-1)
        out = packed.new_zeros((flat.shape[0], *packed.shape[1:]))
        out[flat] = packed
        return out

    def gather(self, block: torch.Tensor) -> torch.Tensor:
        """The real tokens of block values [rows * width, ...], back in packed order."""
        return block if not self.padded else block[self.valid.reshape(-1)]

    def _mask(self, window: int | None, causal: bool, dtype: torch.dtype) -> torch.Tensor | None:
        key = (window, causal, dtype)
        if key not in self._masks:
            allowed = None
            if self.keys is not None:
                allowed = self.keys[:, None, None, :]
            elif self.padded:
                allowed = self.valid[:, None, None, :]
            band = _band(self.width, window, causal, self.valid.device)
            if band is not None:
                allowed = band if allowed is None else allowed & band
            self._masks[key] = _additive(allowed, dtype)
        return self._masks[key]

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None = None,
        v: torch.Tensor | None = None,
        *,
        window: int | None = None,
        causal: bool = False,
        bias: PositionBias | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """As `Segments.attend`, over the block."""
        import torch.nn.functional as F

        sdpa = self.attention or F.scaled_dot_product_attention
        rows, width = self.rows, self.width
        if k is None:
            heads, head_dim = q.shape[-2], q.shape[-1]
            qb, kb, vb = q.view(rows, width, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        else:
            assert v is not None
            heads, head_dim = q.shape[1], q.shape[2]
            qb, kb, vb = (t.view(rows, width, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
        out = _sdpa_call(sdpa, qb, kb, vb, self._mask(window, causal, q.dtype), bias, scale)
        return out.transpose(1, 2).reshape(rows * width, heads * head_dim)


Layout = Segments | Block
