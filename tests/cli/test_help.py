"""The command line helps with mistakes: its version, no abbreviations, the nearest option,
`serve --help` in groups with each default and environment variable."""

from __future__ import annotations

import argparse
import re

import pytest

from vllm_srun import __version__, defaults
from vllm_srun.app.service.model_cards import profile_of
from vllm_srun.cli.main import build_parser, main
from vllm_srun.plugins.bodies import NUMERICS


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    try:
        status = main(argv)
    except SystemExit as exc:
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def help_text(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    status, out, _ = run(capsys, [*command, "--help"])
    assert status == 0
    return out


def flat(text: str) -> str:
    return " ".join(text.split())


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, ["--version"]) == (0, f"vllm-srun {__version__}\n", "")


@pytest.mark.parametrize(
    ("argv", "usage", "nearest"),
    [
        (["serve", "pkg", "--prot", "8002"], "usage: vllm-srun serve ", "--port"),
        # argparse would have taken an abbreviation as --max-num-seqs, silently.
        (["serve", "pkg", "--max-num-seq", "8"], "usage: vllm-srun serve ", "--max-num-seqs"),
        (["worker", "pkg", "--redis", "redis://x", "--dtyp", "int8"], "usage: vllm-srun worker ", "--dtype"),
        (["jobs", "status", "job-1", "--ur", "http://x"], "usage: vllm-srun jobs status ", "--url"),
    ],
)
def test_an_unknown_option_names_the_subcommands_nearest(
    capsys: pytest.CaptureFixture[str], argv: list[str], usage: str, nearest: str
) -> None:
    status, out, err = run(capsys, argv)
    assert status == 2 and out == ""
    assert err.startswith(usage), err
    assert (
        err.strip()
        .splitlines()[-1]
        .endswith(f"unrecognized arguments: {' '.join(argv[-2:])} (did you mean {nearest}?)")
    )


def test_no_parser_takes_abbreviations() -> None:
    pending: list[argparse.ArgumentParser] = [build_parser()]
    seen = 0
    while pending:
        parser = pending.pop()
        seen += 1
        assert parser.allow_abbrev is False, parser.prog
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending += action.choices.values()
    assert seen > 10  # every subcommand, and the jobs' own


def test_serve_help_is_grouped_with_defaults_and_variables(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_SRUN_API_KEY", "secret-key-never-shown")
    text = help_text(capsys, "serve")
    titles = re.findall(r"^(\w[\w ]*):$", text, flags=re.MULTILINE)
    assert titles == [
        "options",
        "model",
        "numerics",
        "batching",
        "limits",
        "Redis",
        "auth",
        "jobs",
        "network",
    ]
    shown = flat(text)
    assert "secret-key-never-shown" not in text
    assert "--api-key API_KEY require this key [env: VLLM_SRUN_API_KEY]" in shown
    assert "[env: VLLM_SRUN_API_KEY_FILE]" in shown and "[env: HF_HUB_CACHE, else HF_HOME/hub]" in shown
    for flag, default in (
        ("--port PORT", defaults.PORT),
        ("--max-num-seqs MAX_NUM_SEQS", defaults.MAX_NUM_SEQS),
        ("--max-inputs MAX_INPUTS", defaults.MAX_INPUTS),
        ("--job-ttl-s JOB_TTL_S", defaults.JOB_TTL_S),
    ):
        assert re.search(re.escape(flag) + r" [^[]*\[default: " + re.escape(str(default)) + r"\]", shown), (
            flag
        )
    # A default decided elsewhere (ConnectionLimits, BulkQuotas) is shown too.
    assert re.search(r"--max-connections MAX_CONNECTIONS [^[]*\[default: \d+\]", shown)
    assert re.search(r"--max-stored-result-bytes MAX_STORED_RESULT_BYTES [^[]*\[default: \d+\]", shown)
    # Every option that takes a value says its default, or where it comes from.
    for line in re.findall(r"^  (--[\w-]+ [A-Z_{][^\n]*(?:\n {20,}[^\n]*)*)", text, flags=re.MULTILINE):
        assert (
            "[default:" in line
            or "[env:" in line
            or "--uds " in line
            or "--family " in line
            or ("--models " in line or "--config " in line)
        ), line


def test_no_help_prints_a_secret_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_SRUN_API_KEY", "secret-key-never-shown")
    monkeypatch.setenv("VLLM_SRUN_URL", "http://elsewhere:1")
    for command in (["serve"], ["check-config"], ["jobs", "submit"], ["jobs", "status"]):
        text = flat(help_text(capsys, *command))
        assert "secret-key-never-shown" not in text and "[env: VLLM_SRUN_API_KEY]" in text, command
    assert "[env: VLLM_SRUN_URL]" in flat(help_text(capsys, "jobs", "results"))


def test_dtype_and_max_speed_say_what_models_will_report(capsys: pytest.CaptureFixture[str]) -> None:
    shown = flat(help_text(capsys, "serve"))
    assert "--dtype {auto,float32,bfloat16,int8}" in shown
    assert "/v1/models reports that dtype and profile max_speed" in shown
    for dtype in ("float32", "bfloat16", "int8"):
        # The same words in --help and in the model card's profile (/v1/models).
        assert profile_of(dtype).description == NUMERICS[dtype]
        assert f"{dtype}: {NUMERICS[dtype]}" in shown
    assert (profile_of("int8").name, profile_of("float32").name) == ("max_speed", "exact")
    assert "--dtype {auto,float32,bfloat16,int8}" in flat(help_text(capsys, "worker"))
