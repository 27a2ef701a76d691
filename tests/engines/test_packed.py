"""Linears on oneDNN's linear (packed.py): the product of the bfloat16 weight and bias, float32's
within float32 rounding of the float64 product, every linear of an encoder layer on the CPU
replaced by one, and the plain linears a tracer gets back."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from vllm_srun.engines.native import packed  # noqa: E402
from vllm_srun.engines.native.quantize import Bfloat16Linear  # noqa: E402

pytestmark = pytest.mark.skipif(not packed.available(), reason="no oneDNN linear on this torch and CPU (AVX-512 needed)")


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
    out = packed.PackedLinear(linear, torch.bfloat16)(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (*shape[:-1], 80)
    assert close(out, expected(linear, x))
    # int8's kept linears: float32 in and out, the same product in between.
    kept = Bfloat16Linear(linear)(x)
    assert kept.dtype == torch.float32 and close(kept, expected(linear, x))


@pytest.mark.parametrize("shape", [(1, 48), (37, 48), (2, 5, 48)])
def test_packed_linear_in_float32_is_the_float32_linear(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80)
    with torch.no_grad():
        linear.bias.mul_(20)
    x = torch.randn(*shape)
    out = packed.PackedLinear(linear)(x)
    assert out.dtype == torch.float32 and out.shape == (*shape[:-1], 80)
    want = torch.nn.functional.linear(x.double(), linear.weight.double(), linear.bias.double())
    # float32 accumulation over 48 products: far inside 1e-5 of the float64 product, and far
    # outside it for a bfloat16 product (2^-8 relative).
    assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_linears_hand_a_tracer_the_weights_and_put_the_packed_ones_back(dtype: torch.dtype) -> None:
    from vllm_srun.engines.native.bert import BertLayer

    torch.manual_seed(0)
    config = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64}
    layer = BertLayer(config).to(dtype)
    weights = {name: p.detach().clone() for name, p in layer.named_parameters() if name.endswith("weight")}
    packed.pack_linears([layer])
    with packed.plain_linears(layer):
        plain = [m for m in layer.modules() if isinstance(m, torch.nn.Linear)]
        assert len(plain) == 4 and not any(isinstance(m, packed.PackedLinear) for m in layer.modules())
        now = dict(layer.named_parameters())
        assert set(now) >= set(weights)
        for name, weight in weights.items():
            assert now[name].dtype == dtype and torch.equal(now[name], weight), name
    assert sum(isinstance(m, packed.PackedLinear) for m in layer.modules()) == 4


def test_bfloat16_encoder_layers_run_packed_linears() -> None:
    from vllm_srun.engines.native.bert import BertLayer

    config = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64}
    layer = BertLayer(config).to(torch.bfloat16)
    assert packed.pack_linears([layer]) == 4  # fused q/k/v, attention output, intermediate, output
    assert not any(isinstance(m, torch.nn.Linear) for m in layer.modules())


# One linear of each kind the engine builds on oneDNN, run in a process of its own with oneDNN's
# log on: it names the kernel each ran on.
_KERNEL_PROBE = """
import torch
torch.set_grad_enabled(False)
from vllm_srun.engines.native import packed, quantize
linear = torch.nn.Linear(256, 256)
quantize.Int8Linear(linear)(torch.randn(64, 256))
packed.PackedLinear(linear, torch.bfloat16)(torch.randn(64, 256).to(torch.bfloat16))
"""


def test_linears_run_on_oneDNNs_fast_kernels_where_the_cpu_has_the_instructions() -> None:
    # A signed int8 activation on a CPU with VNNI but no AMX ran on oneDNN's reference kernel,
    # about a thousand times slower, with right results: only the kernel's name tells.
    import os
    import subprocess
    import sys

    from vllm_srun.accelerators import cpu_features

    flags = cpu_features.host_flags() or frozenset()
    needs = {"matmul": {"avx512_vnni", "amx_int8"}, "inner_product": {"avx512_bf16", "amx_bf16"}}
    if not packed.int8_available() or not all(flags & need for need in needs.values()):
        pytest.skip("needs oneDNN's int8 linear and a CPU with x86 VNNI and bfloat16 instructions")
    log = subprocess.run(
        [sys.executable, "-c", _KERNEL_PROBE],
        env={**os.environ, "ONEDNN_VERBOSE": "1"},
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    # onednn_verbose,v1,primitive,exec,cpu,<primitive>,<kernel>,...
    ran = {f[5]: f[6] for f in (line.split(",") for line in log.splitlines()) if f[3:5] == ["exec", "cpu"]}
    assert set(needs) <= set(ran), log
    for primitive in needs:
        assert not ran[primitive].startswith("ref"), f"{primitive} ran on {ran[primitive]}"


@pytest.mark.parametrize("rows", [1, packed.EXACT_ROWS, packed.EXACT_ROWS + 1, 200])
def test_row_counts_past_the_exact_ones_run_padded_to_a_bucket_with_the_same_rows(rows: int) -> None:
    padded = packed.bucket_rows(rows)
    assert padded == rows if rows <= packed.EXACT_ROWS else padded % packed.ROW_BUCKET == 0
    assert rows <= padded < rows + packed.ROW_BUCKET
    torch.manual_seed(rows)
    linear = torch.nn.Linear(48, 80)
    x = torch.randn(rows, 48)
    out = packed.PackedLinear(linear)(x)
    assert out.shape == (rows, 80) and out.is_contiguous()
    want = torch.nn.functional.linear(x.double(), linear.weight.double(), linear.bias.double())
    assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("name", "approximate"), [("gelu", "none"), ("gelu_new", "tanh"), ("relu", None)])
def test_a_fused_activation_is_the_activation_of_the_linear(name: str, approximate: str | None) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80)
    x = torch.randn(37, 48)
    fused = packed.PackedLinear(linear)
    fused.fuse(name)
    want = torch.nn.functional.linear(x.double(), linear.weight.double(), linear.bias.double())
    want = torch.relu(want) if approximate is None else torch.nn.functional.gelu(want, approximate=approximate)
    # Applied at all, and the right one: gelu's erf and tanh forms differ by about 1e-3 here.
    assert torch.allclose(fused(x).double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packing_fuses_the_ffn_activation_and_a_tracer_still_sees_it(dtype: torch.dtype) -> None:
    from vllm_srun.engines.native.attention import Segments
    from vllm_srun.engines.native.bert import BertLayer
    from vllm_srun.engines.native.distilbert import FFN

    torch.manual_seed(0)
    config = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64}
    layer, ffn = BertLayer(config).to(dtype).eval(), FFN(32, 64, "gelu").to(dtype).eval()
    x = torch.randn(9, 32).to(dtype)
    segments = Segments.from_offsets(np.asarray([0, 4, 9]), torch.device("cpu"))
    with torch.inference_mode():
        before = layer(x, segments), ffn(x)
        packed.pack_linears([layer, ffn])
        assert packed.applies_activation(layer.intermediate.dense) and packed.applies_activation(ffn.lin1)
        assert not packed.applies_activation(layer.output.dense)
        after = layer(x, segments), ffn(x)
        with packed.plain_linears(layer), packed.plain_linears(ffn):
            traced = layer(x, segments), ffn(x)
    # float32: one rounding apart; bfloat16: the fused form rounds once where the plain rounds the
    # linear's output and then gelu's, a few bfloat16 units at most. Without the activation the
    # outputs differ by tenths.
    tolerance = 1e-5 if dtype == torch.float32 else 2**-4
    for got in (after, traced):
        for a, b in zip(got, before, strict=True):
            torch.testing.assert_close(a.float(), b.float(), atol=tolerance, rtol=tolerance)
