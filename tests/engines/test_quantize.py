"""The int8 linear's arithmetic against a float64 reference of the same quantization, on
oneDNN's int8 linear and on torch._int_mm.

The end-to-end bounds (test_reduced_precision) would pass a scale or bias applied slightly
wrong; this pins what Int8Linear computes: per-token symmetric int8 activations, per-channel
int8 weights, an exact integer product, then both scales and the bias.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm_srun.engines.native.quantize import QMAX, Int8Linear, quantize_weight  # noqa: E402


def reference(linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """What per-token int8 x per-channel int8 means, in float64."""
    q_w, w_scale = quantize_weight(linear.weight)
    amax = x.abs().amax(dim=1, keepdim=True)
    q_x = torch.round(x * (QMAX / amax)).double()  # rounded as the module rounds, in float32
    product = q_x @ q_w.double().t()  # exact: integers well inside float64's 2^53
    return product * (amax.double() / QMAX) * w_scale.double() + linear.bias.double()


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "int_mm"])
def test_int8_linear_is_its_quantization_exactly(onednn: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_srun.engines.native import packed

    if onednn and not packed.int8_available():
        pytest.skip("no oneDNN int8 linear on this torch and CPU (AVX-512 needed)")
    monkeypatch.setattr(packed, "int8_available", lambda: onednn)
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 160)
    x = torch.randn(37, 96)
    x[3] *= 50  # one token with a far larger range: its scale alone must change
    module = Int8Linear(linear)
    assert module.onednn is onednn
    out = module(x)
    expected = reference(linear, x)
    # float32 rounding of a few multiplies, not quantization error (that is in both).
    assert torch.allclose(out.double(), expected, rtol=1e-6, atol=1e-6 * float(expected.abs().max()))
