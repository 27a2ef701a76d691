"""bfloat16 linears on oneDNN's linear (packed.py): the product of the bfloat16 weight and bias,
and every linear of a bfloat16 encoder layer on the CPU replaced by one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm_srun.engines.native import packed  # noqa: E402
from vllm_srun.engines.native.quantize import Bfloat16Linear  # noqa: E402

pytestmark = pytest.mark.skipif(not packed.available(), reason="this torch has no oneDNN linear")


def expected(linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The linear of the bfloat16-rounded input, weight and bias, in float64."""
    w, b = (t.detach().to(torch.bfloat16).double() for t in (linear.weight, linear.bias))
    return torch.nn.functional.linear(x.to(torch.bfloat16).double(), w, b)


def close(out: torch.Tensor, want: torch.Tensor) -> bool:
    # One bfloat16 rounding of the float32 accumulator (2^-8 relative), nothing more.
    return torch.allclose(out.double(), want, rtol=2**-7, atol=2**-7 * float(want.abs().max()))


@pytest.mark.parametrize("shape", [(1, 48), (37, 48), (2, 5, 48)])
def test_packed_linear_is_the_bfloat16_linear(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80)
    with torch.no_grad():
        linear.bias.mul_(20)  # a bias left out, or added twice, shows
    x = torch.randn(*shape)
    out = packed.PackedLinear(linear)(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (*shape[:-1], 80)
    assert close(out, expected(linear, x))
    # int8's kept linears: float32 in and out, the same product in between.
    kept = Bfloat16Linear(linear)(x)
    assert kept.dtype == torch.float32 and close(kept, expected(linear, x))


def test_bfloat16_encoder_layers_run_packed_linears() -> None:
    from vllm_srun.engines.native.bert import BertLayer

    config = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64}
    layer = BertLayer(config).to(torch.bfloat16)
    assert packed.pack_linears([layer]) == 4  # fused q/k/v, attention output, intermediate, output
    assert not any(isinstance(m, torch.nn.Linear) for m in layer.modules())
