"""Self-attention over packed rows: each row attends only to itself.

The projections and the MLP run on the packed tokens (no padding compute where nearly all the
FLOPs are). Attention alone regroups rows: sorted by length, split into a few groups (see
`partition`), each gathered into a padded block for one SDPA call with a key-padding (and, for
sliding layers, band) mask. Results go back to each row's packed positions, so callers never
see the grouping; only float rounding inside SDPA can vary with the padded width (~1e-7).

Why groups: attending row by row issues a few small ops per row and layer, each a parallel
region whose barriers dominate when several threads share a busy machine; one padded block over
the whole batch wastes compute on padding; a block-diagonal mask over all tokens is quadratic in
the batch's tokens; nested (jagged) tensors were slower than padded calls. A few padded groups
keep the op count low with little padding (bench/native_forward.py times the forward).

An accelerator may offer its own attention kernel (`Accelerator.kernels()`, name
`scaled_dot_product_attention`): it is called in place of torch's on each padded group.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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


@dataclass
class _Group:
    """Rows padded into one [rows, width] block; `gather` maps each cell to a packed token."""

    rows: int
    width: int
    gather: torch.Tensor  # [rows * width]; padding cells repeat a real token (they are masked)
    valid: torch.Tensor  # [rows, width] bool
    cells: tuple[torch.Tensor, torch.Tensor] | None  # (row, column) of each real cell; None: no padding
    masks: dict[tuple[int | None, torch.dtype], torch.Tensor | None] = field(default_factory=dict)

    def mask(self, window: int | None, dtype: torch.dtype) -> torch.Tensor | None:
        """Additive SDPA mask (0 or -inf), None when every cell may see every other.

        Additive rather than boolean: SDPA would convert a boolean mask on every call (two more
        ops per group and layer); this one is built once per batch.
        """
        key = (window, dtype)
        if key not in self.masks:
            import torch

            allowed = self.valid[:, None, None, :] if self.cells is not None else None
            if window is not None and self.width - 1 > window:
                idx = torch.arange(self.width, device=self.valid.device)
                band = (idx[:, None] - idx[None, :]).abs() <= window
                allowed = band if allowed is None else allowed & band
            self.masks[key] = None
            if allowed is not None:
                zeros = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
                self.masks[key] = zeros.masked_fill(~allowed, float("-inf"))
        return self.masks[key]


@dataclass
class Segments:
    """Where each packed row starts and ends, per-token positions (restarting at 0 each row),
    and the padded groups attention runs on (built once per batch, shared by all layers)."""

    starts: list[int]
    lengths: list[int]
    positions: torch.Tensor
    row_ids: torch.Tensor
    attention: AttentionKernel | None = None  # an accelerator's kernel; None: torch's SDPA
    _groups: list[_Group] | None = None
    _tokens: torch.Tensor | None = None  # packed position of every real cell, group after group

    @classmethod
    def from_offsets(
        cls, offsets: np.ndarray, device: torch.device, *, attention: AttentionKernel | None = None
    ) -> Segments:
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
        )

    def groups(self) -> tuple[list[_Group], torch.Tensor]:
        """The padded attention groups and, for their real cells in order, the packed positions."""
        if self._groups is None or self._tokens is None:
            self._groups, self._tokens = self._build_groups()
        return self._groups, self._tokens

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
                )
            )
        return groups, torch.as_tensor(np.concatenate(tokens), device=device)


def packed_attention(qkv: torch.Tensor, segments: Segments, *, window: int | None = None) -> torch.Tensor:
    """Scaled dot-product attention over packed `qkv` ([tokens, 3, heads, head_dim]).

    Each row attends only to its own tokens; with `window`, a query sees only keys at most
    `window` positions away (bidirectional sliding window). Returns [tokens, heads * head_dim].
    """
    import torch
    import torch.nn.functional as F

    tokens, _, heads, head_dim = qkv.shape
    sdpa = segments.attention or F.scaled_dot_product_attention
    groups, positions = segments.groups()
    blocks = []
    for g in groups:
        # One gather for q, k and v together: [rows, width, 3, heads, dim] -> 3 x [rows, heads, width, dim]
        q, k, v = (
            qkv.index_select(0, g.gather).view(g.rows, g.width, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        )
        block = sdpa(q, k, v, attn_mask=g.mask(window, qkv.dtype)).transpose(1, 2)
        blocks.append(block.reshape(-1, heads, head_dim) if g.cells is None else block[g.cells])
    out = qkv.new_empty(tokens, heads, head_dim)
    out.index_copy_(0, positions, blocks[0] if len(blocks) == 1 else torch.cat(blocks))
    return out.view(tokens, heads * head_dim)
