"""--max-speed: the fastest dtype this CPU runs natively, said why, and the next one where the
twin check refuses it. The CPU's flags are faked (VLLM_SRUN_CPU_FLAGS) to reach each branch."""

from __future__ import annotations

import asyncio
import platform

import pytest

from vllm_srun.accelerators.cpu_features import FLAGS_ENV, host_refusal
from vllm_srun.app.loading import ServedModel, bring_up
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.queue.worker.coalescer import BatchLimits
from vllm_srun.registry.loader import ModelOptions, Prepared, prepare
from vllm_srun.registry.tables import load_tables

x86 = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"), reason="the flag sets here are x86's"
)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("torch")
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    return str(write_fixture(tmp_path_factory.mktemp("max-speed") / "embed", variant="bert-embedding"))


def prepared(ref: str, *, with_engine: bool = True, **options: object) -> Prepared:
    plugins = load_plugins()
    tables = load_tables(e.plugin for e in plugins.of("families").values())
    return prepare(plugins, tables, ModelOptions(ref=ref, device="cpu", **options), with_engine=with_engine)  # type: ignore[arg-type]


@x86
@pytest.mark.parametrize(
    ("flags", "dtype", "fallbacks", "why"),
    [
        # Sapphire Rapids: AMX; bfloat16 first, int8 (slower there) next.
        ("avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8", "bfloat16", ("int8", "float32"), "fastest"),
        ("avx512f avx512_vnni avx512_bf16", "bfloat16", ("int8", "float32"), "fastest"),  # Zen 4
        ("avx512f avx512_vnni", "int8", ("float32",), "not bfloat16: this CPU lacks any of AVX512-BF16"),
        ("avx2", "float32", (), "nothing faster runs natively here (not bfloat16: "),
    ],
)
def test_max_speed_picks_the_fastest_dtype_this_cpu_runs(
    embedder: str,
    monkeypatch: pytest.MonkeyPatch,
    flags: str,
    dtype: str,
    fallbacks: tuple[str, ...],
    why: str,
) -> None:
    monkeypatch.setenv(FLAGS_ENV, flags)
    placement = prepared(embedder, max_speed=True).placement
    assert (placement.dtype, placement.fallbacks) == (dtype, fallbacks)
    assert placement.reason.startswith(f"--max-speed: {dtype}") and why in placement.reason, placement.reason
    # An app replica (no engine) expects the dtype the workers on such a CPU start in.
    assert prepared(embedder, with_engine=False, max_speed=True).placement.dtype == dtype


def test_dtype_auto_stays_float32_and_says_so(embedder: str) -> None:
    placement = prepared(embedder).placement
    assert (placement.dtype, placement.reason, placement.fallbacks) == (
        "float32",
        "--dtype auto: float32, the exact reference",
        (),
    )


@x86
@pytest.mark.skipif(bool(host_refusal("bfloat16")), reason="bfloat16 is emulated on this CPU")
def test_a_refused_dtype_falls_back_to_the_next(embedder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bound bfloat16 cannot meet (a cosine of exactly 1) refuses it; --max-speed then
    serves float32 (int8 is left out: no VNNI among the faked flags), and says why."""
    monkeypatch.setenv(FLAGS_ENV, "avx512f avx512_bf16")
    p = prepared(embedder, max_speed=True, bounds=(("min_cosine", 1.0),))
    assert p.placement.fallbacks == ("float32",)
    served = ServedModel(p.name, BatchLimits(), placement=p.placement)

    async def ready(_: ServedModel) -> None:
        return None

    asyncio.run(bring_up(served, p, ready))
    assert served.state == "ready", served.reason
    assert served.placement is not None and served.placement.dtype == "float32"
    assert served.model is not None and served.model.info.numerics == "float32"
    assert served.placement.reason.startswith(
        "--max-speed: float32, as bfloat16 was refused: min_cosine 0.99"
    ), served.placement.reason
    assert "(needs >= 1.0)" in served.placement.reason and served.approximation is None


def test_an_explicit_dtype_is_not_fallen_back_from(embedder: str) -> None:
    from vllm_srun.registry.loader import fall_back

    if host_refusal("bfloat16"):
        pytest.skip("bfloat16 is refused on this CPU")
    p = prepared(embedder, dtype="bfloat16")
    assert p.placement.reason == "--dtype bfloat16" and fall_back(p, "min_cosine 0.9") is None


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_dtype_help_lists_every_dtype_the_server_accepts(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from vllm_srun.cli.main import build_parser
    from vllm_srun.registry.loader import DTYPES

    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    dtype_help = text[text.index("--dtype {", text.index("options:")) :][:120]
    assert all(d in dtype_help for d in DTYPES), dtype_help
