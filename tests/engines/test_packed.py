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
    # GELU and both residual adds run inside the linears.
    assert layer.intermediate.dense.activation == "gelu"
    assert layer.attention.output._fused_add and layer.output._fused_add


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_an_activation_inside_the_linear_is_the_activation_of_the_linear(act: str) -> None:
    from vllm_srun.engines.native.layers import activation

    torch.manual_seed(1)
    linear = torch.nn.Linear(48, 96)
    x = torch.randn(37, 48)
    fused = packed.PackedLinear(linear)
    assert fused.fuse(act) and fused.activation == act
    want = activation(act)(expected(linear, x))
    assert close(fused(x.to(torch.bfloat16)), want)
    # An activation oneDNN does not have stays outside: nothing changes.
    plain = packed.PackedLinear(linear)
    assert not plain.fuse("silu") and plain.activation is None


def test_a_residual_added_inside_the_linear_is_the_sum() -> None:
    torch.manual_seed(2)
    linear = torch.nn.Linear(48, 32)
    x, residual = torch.randn(2, 19, 48), torch.randn(2, 19, 32) * 10  # a residual dropped shows
    out = packed.PackedLinear(linear).plus(x.to(torch.bfloat16), residual.to(torch.bfloat16))
    assert out.shape == (2, 19, 32) and out.dtype == torch.bfloat16
    assert close(out, expected(linear, x) + residual.to(torch.bfloat16).double())


def test_a_fused_layer_matches_the_unfused_one() -> None:
    import copy

    from vllm_srun.engines.native.attention import Segments
    from vllm_srun.engines.native.bert import BertLayer

    torch.manual_seed(3)
    config = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64}
    layer = BertLayer(config).to(torch.bfloat16).eval()
    unfused = copy.deepcopy(layer)
    packed.pack_linears([layer])
    packed.pack_linears([unfused], fuse=False)
    assert unfused.intermediate.dense.activation is None and not unfused.output._fused_add
    import numpy as np

    segments = Segments.from_offsets(np.array([0, 5, 16, 19]), torch.device("cpu"))
    x = torch.randn(19, 32).to(torch.bfloat16)
    with torch.no_grad():
        a, b = layer(x, segments), unfused(x, segments)
    # Each path rounds to bfloat16 in other places: within a few of its steps, not bitwise.
    assert torch.allclose(a.float(), b.float(), atol=0.05), (a.float() - b.float()).abs().max()


# One linear of each kind the engine builds on oneDNN, run in a process of its own with oneDNN's
# log on: it names the kernel each ran on.
_KERNEL_PROBE = """
import torch
torch.set_grad_enabled(False)
from vllm_srun.engines.native import packed, quantize
linear = torch.nn.Linear(256, 256)
quantize.Int8Linear(linear)(torch.randn(64, 256))
packed.PackedLinear(linear)(torch.randn(64, 256).to(torch.bfloat16))
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
