"""float32 and bfloat16 attention on the CPU as two matmuls around a softmax
(attention.PLAIN_MAX_CELLS): the numbers of torch's SDPA, with masks, position biases, a given
scale and grouped key/value heads, taken only within its size bound, only in those dtypes and
only with torch's own kernel."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from vllm_srun.engines.native import attention  # noqa: E402

F = torch.nn.functional


def blocks(rows: int, heads: int, width: int, dim: int, kv_heads: int | None = None) -> tuple[Any, ...]:
    torch.manual_seed(rows * 100 + width)
    q = torch.randn(rows, heads, width, dim)
    k = torch.randn(rows, kv_heads or heads, width, dim)
    v = torch.randn(rows, kv_heads or heads, width, dim)
    return q, k, v


def padded(rows: int, width: int) -> Any:
    mask = torch.zeros(rows, 1, 1, width)
    mask[1:, :, :, width - 2 :] = float("-inf")  # every row but the first has two padding keys
    return mask


def reference(q: Any, k: Any, v: Any, mask: Any, scale: float | None) -> Any:
    """SDPA's math in float64, grouped heads repeated."""
    if k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=None if mask is None else mask.double(), scale=scale
    )


@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize(("rows", "width", "kv_heads"), [(1, 7, None), (4, 19, None), (3, 12, 2)])
def test_plain_attention_is_sdpas(rows: int, width: int, kv_heads: int | None, scale: float | None) -> None:
    q, k, v = blocks(rows, 4, width, 8, kv_heads)
    mask = padded(rows, width)

    def bias(qb: Any, kb: Any, w: int) -> Any:
        return torch.linspace(-1, 1, w * w).view(1, 1, w, w).expand(1, qb.shape[1], w, w)

    taken: list[bool] = []
    plain = attention._plain_attention

    def spy(*args: Any) -> Any:
        taken.append(True)
        return plain(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "_plain_attention", spy)
        got = attention._sdpa_call(F.scaled_dot_product_attention, q, k, v, mask, bias, scale)
    assert taken == [True]
    want = reference(q, k, v, bias(q, k, width) + mask, scale)
    # float32 rounding only: a missing scale, mask or bias moves values by far more.
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("rows", "width"), [(1, 7), (4, 19), (6, 40)])
def test_plain_attention_in_bfloat16_is_within_bfloat16_rounding_of_sdpas(rows: int, width: int) -> None:
    q, k, v = (t.bfloat16() for t in blocks(rows, 4, width, 8))
    mask = padded(rows, width)
    got = attention._sdpa_call(F.scaled_dot_product_attention, q, k, v, mask.bfloat16(), None, None)
    assert got.dtype == torch.bfloat16
    want = reference(q, k, v, mask, None)
    # The scores, the weights and the output each rounded once to bfloat16 (2^-9 relative): on
    # these unit-variance blocks that stays within 2^-5 of the largest value (torch's bfloat16
    # SDPA, which keeps its scores float32, within about 2^-8), where a lost mask or scale moves
    # values by tenths.
    error = float((got.double() - want).abs().max())
    assert error <= 2**-5 * float(want.abs().max()), error
    assert attention._plain_fits(q, k)


def test_plain_attention_only_for_small_float32_and_bfloat16_blocks_on_torchs_kernel() -> None:
    q, k, _ = blocks(2, 4, 16, 8)
    assert attention._plain_fits(q, k)
    assert attention._plain_fits(q.bfloat16(), k.bfloat16())
    assert not attention._plain_fits(q.half(), k.half())
    side = int((attention.PLAIN_MAX_CELLS // 4) ** 0.5) + 1  # one row, 4 heads, past the bound
    big_q, big_k, _ = blocks(1, 4, side, 2)
    assert not attention._plain_fits(big_q, big_k)
    calls: list[int] = []

    def kernel(q: Any, k: Any, v: Any, attn_mask: Any = None, **kw: Any) -> Any:
        calls.append(1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kw)

    q, k, v = blocks(2, 4, 16, 8)
    attention._sdpa_call(kernel, q, k, v, None, None, None)  # an accelerator's kernel: always it
    assert calls == [1]
