"""layers.rotate_, the in-place rotary that ModernBERT, NomicBERT, GTE and Qwen3 share: the same
bits as the reference's out-of-place `x * cos + rotate_half(x) * sin` (Transformers'
rotate_half), in float32, in bfloat16 over float32 tables (computed in float32 and cast back, as
ModernBERT's reference does) and in bfloat16 throughout (Qwen3's tables are in the model's dtype),
written into the view it is given and nowhere else."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.models.llama.modeling_llama import rotate_half  # noqa: E402

from vllm_srun.engines.native.layers import rotate_  # noqa: E402

TOKENS, HEADS, DIM = 37, 4, 16


def _tables(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, DIM, 2, dtype=torch.float32) / DIM))
    angles = torch.arange(TOKENS, dtype=torch.float32)[:, None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)[:, None, None, :]  # [tokens, 1, 1, dim]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    xf = x.to(cos.dtype)
    return (xf * cos + rotate_half(xf) * sin).to(x.dtype)


@pytest.mark.parametrize(
    ("dtype", "tables"),
    [(torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)],
    ids=["float32", "bfloat16-float32-tables", "bfloat16"],
)
def test_rotate_in_place_is_the_references_bits(dtype: torch.dtype, tables: torch.dtype) -> None:
    torch.manual_seed(0)
    qkv = torch.randn(TOKENS, 3, HEADS, DIM).to(dtype)  # a fused projection: q and k rotate, v not
    before = qkv.clone()
    cos, sin = _tables(tables)
    want = _reference(before[:, :2], cos, sin)
    got = rotate_(qkv[:, :2], cos, sin)
    assert got.data_ptr() == qkv.data_ptr() and got.dtype == dtype  # written into the view
    assert torch.equal(qkv[:, :2], want)
    assert torch.equal(qkv[:, 2], before[:, 2])  # v untouched
    assert not torch.equal(want, before[:, :2])  # the rotation moved something


def test_rotate_of_separate_heads() -> None:
    """Qwen3's layout: q [tokens, heads, dim] and k with fewer heads, each rotated on its own."""
    torch.manual_seed(1)
    cos, sin = (t[:, 0] for t in _tables(torch.float32))  # [tokens, 1, dim]
    for heads in (HEADS, 1):
        x = torch.randn(TOKENS, heads, DIM)
        want = _reference(x, cos, sin)
        assert torch.equal(rotate_(x, cos, sin), want)
