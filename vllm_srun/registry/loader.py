"""From a model reference and options to a LoadedModel: package, family, device, engine, dtype.

`auto` choices follow the plugins' `auto_priority` (lower first). Engines without one are
tried after the rest, by name; accelerators without one are used only when named.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import structlog

from vllm_srun import defaults
from vllm_srun.errors import ConfigError, PackageError
from vllm_srun.plugins import bodies
from vllm_srun.plugins.architectures import converts, refusal, served_kind
from vllm_srun.plugins.base import Accelerator, Device, Engine, LoadedModel, ModelFamily, ModelSpec
from vllm_srun.plugins.discovery import Plugins
from vllm_srun.plugins.package import ONNX_PATHS, ModelPackage
from vllm_srun.registry.resolve import Resolved, resolve
from vllm_srun.registry.tables import Tables, check_identity, load_tables

log = structlog.get_logger("vllm_srun.registry")

DTYPES = bodies.DTYPES


@dataclass(frozen=True, kw_only=True)
class ModelOptions:
    """How one model is to be served.

    `name` is its id (by default the resolved reference's name: the name a directory's package
    gives its model, else its folder name; a built-in's name; a repository's `org/name`);
    requests may also name it by any of `aliases`.
    """

    ref: str
    name: str | None = None
    aliases: tuple[str, ...] = ()
    family: str | None = None
    engine: str = defaults.ENGINE
    device: str = defaults.DEVICE
    dtype: str = defaults.DTYPE
    allow_download: bool = False
    max_speed: bool = False
    # The operator's bounds for the twin check (registry/bounds.py): (figure, limit) pairs.
    bounds: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Placement:
    """Where a loaded model runs: shown in `/v1/models` and in `meta`."""

    engine: str
    device: str
    dtype: str
    # The dtypes the engine runs on this device here (none known to an app replica).
    dtypes: tuple[str, ...] = ()
    # Why this dtype (the option that chose it, and for --max-speed what the hardware has),
    # and the dtypes --max-speed falls back to, in order, where the twin check refuses it.
    reason: str = ""
    fallbacks: tuple[str, ...] = ()


def _config_problem(package: ModelPackage) -> str:
    """Why config.json may have kept every family from recognising the package, if it says."""
    try:
        config = package.read_json("config.json")
    except PackageError as exc:
        return "" if not package.exists("config.json") else f"; {exc.message}"
    if not isinstance(config, dict):
        return f"; config.json is a JSON {type(config).__name__}, not an object"
    if converts(config) or served_kind(config, has_onnx=any(package.exists(p) for p in ONNX_PATHS)) is None:
        return f"; {refusal(config)}"
    return ""


def detect_family(plugins: Plugins, package: ModelPackage, name: str | None = None) -> ModelFamily:
    """The family named (trusted: describe and verify refuse what it cannot read), else the one
    family that recognises the package."""
    if name is not None:
        return plugins.family(name)
    matches = [e.plugin for _, e in sorted(plugins.of("families").items()) if e.plugin.detect(package)]
    if not matches:
        known = "; ".join(
            f"{name} looks for {entry.plugin.looks_for or 'files it does not name'}"
            for name, entry in sorted(plugins.of("families").items())
        )
        raise ConfigError(
            f"no installed family recognises {str(package.root)!r} ({known or 'no family is installed'})"
            + _config_problem(package)
        )
    top = max(m.specificity for m in matches)
    matches = [m for m in matches if m.specificity == top]
    if len(matches) > 1:
        names = ", ".join(m.name for m in matches)
        raise ConfigError(
            f"several families recognise {str(package.root)!r} ({names}): pick one with --family"
        )
    family: ModelFamily = matches[0]
    return family


def installed_devices(plugins: Plugins) -> list[str]:
    names: list[str] = []
    for _, entry in sorted(plugins.of("accelerators").items()):
        accelerator: Accelerator = entry.plugin
        if accelerator.available():
            names += [d.name for d in accelerator.devices()]
    return names


def resolve_device(plugins: Plugins, wanted: str) -> Device:
    """The device `wanted` names (or the first of the best available accelerator for `auto`),
    carrying its accelerator as `provider`, so that the engine runs on what that plugin offers."""
    accelerators: dict[str, Accelerator] = {n: e.plugin for n, e in plugins.of("accelerators").items()}
    if wanted == "auto":
        ranked = sorted(
            (a for a in accelerators.values() if a.auto_priority is not None),
            key=lambda a: (a.auto_priority, a.name),
        )
        for candidate in ranked:
            if candidate.available() and candidate.devices():
                return replace(candidate.devices()[0], provider=candidate)
        raise ConfigError("no accelerator is available for --device auto")
    name, _, index = wanted.partition(":")
    accelerator = accelerators.get(name)
    if accelerator is not None and accelerator.available():
        for device in accelerator.devices():
            if device.name == wanted or (not index and device.accelerator == name):
                return replace(device, provider=accelerator)
    installed = ", ".join(installed_devices(plugins)) or "none"
    raise ConfigError(
        f"device {wanted!r} is not provided by any installed accelerator (installed: {installed})"
    )


def resolve_engine(plugins: Plugins, spec: ModelSpec, device: Device, wanted: str) -> Engine:
    engines: dict[str, Engine] = {n: e.plugin for n, e in plugins.of("engines").items()}
    if wanted != "auto":
        engine = plugins.engine(wanted)
        reason = engine.supports(spec, device)
        if reason is not None:
            raise ConfigError(f"engine {wanted!r} cannot run {spec.architecture!r} on {device}: {reason}")
        return engine
    ranked = sorted(
        engines.values(),
        key=lambda e: (e.auto_priority is None, e.auto_priority or 0, e.name),
    )
    reasons = []
    for engine in ranked:
        reason = engine.supports(spec, device)
        if reason is None:
            return engine
        reasons.append(f"{engine.name}: {reason}")
    raise ConfigError(
        f"no installed engine runs {spec.architecture!r} on {device} ({'; '.join(reasons) or 'no engines'})"
    )


def resolve_dtype(engine: Engine, wanted: str, device: Device, *, max_speed: bool = False) -> str:
    """The dtype a model starts in (`choose_dtype` says why, and what --max-speed tries next)."""
    return choose_dtype(engine, wanted, device, max_speed=max_speed)[0]


def choose_dtype(
    engine: Engine, wanted: str, device: Device, *, max_speed: bool = False
) -> tuple[str, str, tuple[str, ...]]:
    """(dtype, why it, the dtypes --max-speed falls back to in order where a twin check
    refuses it). `auto` is float32 everywhere: exact numerics are the default."""
    if wanted not in DTYPES:
        raise ConfigError(f"--dtype {wanted!r} is not one of {', '.join(DTYPES)}")
    if max_speed:
        if wanted != "auto":
            raise ConfigError("--max-speed chooses the dtype itself: leave --dtype auto")
        return max_speed_choice(engine, device)
    if wanted == "auto":
        return "float32", "--dtype auto: float32, the exact reference", ()
    if wanted not in engine.dtypes:
        raise ConfigError(f"engine {engine.name!r} runs {', '.join(engine.dtypes)}, not --dtype {wanted}")
    refuse_unrunnable(engine, wanted, device)
    return wanted, f"--dtype {wanted}", ()


# What --max-speed tries, fastest first: bfloat16 before int8, whose int8 linears run slower
# than bfloat16's where a CPU multiplies both natively (docs/performance.md); float32 last.
MAX_SPEED_ORDER = ("bfloat16", "int8")


def max_speed_choice(engine: Engine, device: Device) -> tuple[str, str, tuple[str, ...]]:
    """--max-speed's dtype for `engine` on `device`: the first of MAX_SPEED_ORDER it runs
    natively, why, and the rest (then float32) to fall back to."""
    runnable, lacking = [], []
    for dtype in MAX_SPEED_ORDER:
        reason = (
            dtype_refusal(engine, dtype, device)
            if dtype in engine.dtypes
            else f"engine {engine.name!r} does not run it"
        )
        if reason is None:
            runnable.append(dtype)
        else:
            lacking.append(f"not {dtype}: {reason}")
    if not runnable:
        return (
            "float32",
            f"--max-speed: float32, as nothing faster runs natively here ({'; '.join(lacking)})",
            (),
        )
    first, rest = runnable[0], (*runnable[1:], "float32")
    why = f"--max-speed: {first}, the fastest numerics engine {engine.name!r} runs natively on {device}"
    if lacking:
        why += f" ({'; '.join(lacking)})"
    return first, f"{why}; should its twin check refuse it, {' then '.join(rest)}", rest


def fall_back(prepared: Prepared, refusal: str) -> Prepared | None:
    """The model prepared in the next dtype --max-speed tries after `refusal` of its current
    one, or None where there is none."""
    placement = prepared.placement
    if not placement.fallbacks:
        return None
    dtype, rest = placement.fallbacks[0], placement.fallbacks[1:]
    why = f"--max-speed: {dtype}, as {placement.dtype} was refused: {refusal}"
    return replace(prepared, placement=replace(placement, dtype=dtype, reason=why, fallbacks=rest))


def dtype_refusal(engine: Engine, dtype: str, device: Device) -> str | None:
    """Why `engine` cannot run `dtype` on `device` at the hardware's own speed, if it cannot:
    the engine's reason, else the accelerator's (the instruction sets the CPU lacks)."""
    reason = engine.dtype_refusal(dtype, device)
    if reason is None and device.provider is not None:
        reason = device.provider.dtype_refusal(dtype, device)
    return reason


def refuse_unrunnable(engine: Engine, dtype: str, device: Device) -> None:
    """A ConfigError naming the dtype, the device and what is missing, where it cannot run."""
    reason = dtype_refusal(engine, dtype, device)
    if reason is not None:
        raise ConfigError(f"--dtype {dtype} on {device} refused: {reason}")


def runnable_dtypes(engine: Engine, device: Device) -> tuple[str, ...]:
    """The engine's dtypes that run on `device` here: what /v1/models lists."""
    return tuple(d for d in engine.dtypes if dtype_refusal(engine, d, device) is None)


def numerics_of(options: ModelOptions, dtype: str) -> str:
    """What a deployment's results are computed in, for its cache keys and `meta.numerics`:
    the dtype itself (float32, bfloat16, int8), so that results of two numerics never share a
    key. An app replica knows the dtype it was told, and for --max-speed the one `prepare`
    derived from its device; where even that is unknown, "max_speed", which no worker runs (a
    worker refuses its jobs, naming both, rather than share keys between dtypes)."""
    if dtype not in ("auto", ""):
        return dtype
    return "max_speed" if options.max_speed else "float32"


def max_speed_dtype(device: Device) -> str:
    """The dtype --max-speed starts in on `device` as an app replica sees it (no engine): on the
    cpu the first of MAX_SPEED_ORDER its instruction sets run, else bfloat16."""
    if device.accelerator != "cpu":
        return "bfloat16"
    provider = device.provider
    runs = [d for d in MAX_SPEED_ORDER if provider is None or provider.dtype_refusal(d, device) is None]
    return runs[0] if runs else "float32"


@dataclass(frozen=True)
class Prepared:
    """A model ready to load: the cheap decisions made, nothing heavy read yet."""

    options: ModelOptions
    resolved: Resolved
    family: ModelFamily
    spec: ModelSpec
    name: str
    placement: Placement
    engine: Engine | None = None
    device: Device | None = None
    # Names requests may use besides `options.aliases` when no name was given: a folder's
    # name (see registry.names). Dropped, not refused, where another model claims one.
    default_aliases: tuple[str, ...] = ()

    @property
    def aliases(self) -> tuple[str, ...]:
        return (*self.options.aliases, *self.default_aliases)


def prepare(plugins: Plugins, tables: Tables, options: ModelOptions, *, with_engine: bool) -> Prepared:
    """Resolve the package, its family and (with an engine) its device, engine and dtype.

    Reads only small files; a bad device, engine or dtype fails here, before any weights.
    """
    resolved = resolve(options.ref, tables=tables, allow_download=options.allow_download)
    family_name = options.family or (resolved.builtin.family if resolved.builtin else None)
    family = detect_family(plugins, resolved.package, family_name)
    spec = family.describe(resolved.package)
    name = options.name or resolved.name
    aliases = () if options.name else tuple(a for a in resolved.aliases if a not in options.aliases)
    if not with_engine:
        dtype = options.dtype
        if options.max_speed and dtype == "auto":
            # The dtype the workers will pick, so that this replica's cache keys are theirs.
            try:
                dtype = max_speed_dtype(resolve_device(plugins, options.device))
            except ConfigError:
                pass  # numerics_of says "max_speed": the workers refuse such jobs, naming both
        reason = f"--dtype {options.dtype}" if options.dtype != "auto" else ""
        if options.max_speed and dtype != "auto":
            reason = f"--max-speed: {dtype} expected from this host's {options.device}; the workers choose and check it"
        placement = Placement(engine=options.engine, device=options.device, dtype=dtype, reason=reason)
        return Prepared(options, resolved, family, spec, name, placement, default_aliases=aliases)
    device = resolve_device(plugins, options.device)
    engine = resolve_engine(plugins, spec, device, options.engine)
    dtype, reason, fallbacks = choose_dtype(engine, options.dtype, device, max_speed=options.max_speed)
    placement = Placement(
        engine=engine.name,
        device=str(device),
        dtype=dtype,
        dtypes=runnable_dtypes(engine, device),
        reason=reason,
        fallbacks=fallbacks,
    )
    return Prepared(options, resolved, family, spec, name, placement, engine, device, aliases)


def load_prepared(prepared: Prepared) -> LoadedModel:
    """Verify every file (against its pins for a built-in), read the weights, build the model."""
    package, family = prepared.resolved.package, prepared.family
    verification = family.verify(package)
    if prepared.resolved.builtin is not None:
        check_identity(prepared.resolved.builtin, verification)
    numerics = numerics_of(prepared.options, prepared.placement.dtype)
    engine_model = None
    if prepared.engine is not None and prepared.device is not None:
        host = prepared.engine.read(prepared.spec, prepared.placement.dtype)
        engine_model = prepared.engine.load(prepared.spec, prepared.device, prepared.placement.dtype, host)
    model = family.load(
        package, prepared.spec, engine_model, name=prepared.name, verification=verification, numerics=numerics
    )
    placement = prepared.placement
    log.info(
        "model_loaded",
        model=prepared.name,
        family=family.name,
        engine=placement.engine,
        device=placement.device,
        dtype=placement.dtype,
        dtypes=placement.dtypes,
        dtype_reason=placement.reason,
    )
    return model


def load_model(
    plugins: Plugins, options: ModelOptions, *, with_engine: bool, tables: Tables | None = None
) -> tuple[LoadedModel, Placement]:
    """Prepare and load in one step (tools and tests; the server does the two apart)."""
    if tables is None:
        tables = load_tables(e.plugin for e in plugins.of("families").values())
    prepared = prepare(plugins, tables, options, with_engine=with_engine)
    return load_prepared(prepared), prepared.placement
