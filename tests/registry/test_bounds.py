"""The twin check's bounds: per kind of output, set by the operator, shown beside each figure,
and a refusal that names the option that would accept it."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_srun.cli.config import models_file
from vllm_srun.errors import ConfigError
from vllm_srun.registry.approximate import Approximation, Refused
from vllm_srun.registry.bounds import FIGURES, REPORTED, bounds_for, parse_bound


def test_a_tagger_is_held_per_token_at_the_99th_percentile_and_per_span() -> None:
    token = {b.figure: b.words() for b in bounds_for("token", "bfloat16")}
    assert token == {
        "token_agreement": ">= 0.995",
        "p99_probability_delta": "<= 0.02",
        "span_agreement": ">= 0.99",
    }
    figures = {
        "token_agreement": 0.99994,
        "p99_probability_delta": 0.004,
        "max_probability_delta": 0.041859,  # one token's worst: reported, not bounded
        "span_agreement": 0.9991,
    }
    assert Approximation("token", 256, "bfloat16", figures, bounds_for("token", "bfloat16")).passed()
    low_spans = Approximation(
        "token", 256, "bfloat16", {**figures, "span_agreement": 0.985}, bounds_for("token", "bfloat16")
    )
    assert [b.figure for b in low_spans.missed()] == ["span_agreement"]
    classify = {b.figure: b.words() for b in bounds_for("classify", "bfloat16")}
    assert classify == {"label_agreement": ">= 0.995", "max_probability_delta": "<= 0.02"}
    assert set(REPORTED) == {"embeddings", "rerank", "classify", "token"}
    assert {f for names in REPORTED.values() for f in names} == set(FIGURES)


def test_the_operator_loosens_and_tightens_by_the_reported_names() -> None:
    bounds = bounds_for("embeddings", "bfloat16", {"min_cosine": 0.995, "mean_cosine": 0.9999})
    by_name = {b.figure: b for b in bounds}
    assert by_name["min_cosine"].limit == 0.995 and by_name["min_cosine"].loosened()
    assert by_name["neighbour_overlap"].limit == 0.95 and not by_name["neighbour_overlap"].by_operator
    assert by_name["mean_cosine"].by_operator and not by_name["mean_cosine"].loosened()  # a new bound
    tighter = bounds_for("token", "int8", {"max_probability_delta": 0.05, "span_agreement": 0.999})
    assert {b.figure: b.loosened() for b in tighter if b.by_operator} == {
        "max_probability_delta": False,
        "span_agreement": False,
    }
    with pytest.raises(
        ConfigError, match=r"bound 'min_cosine' does not apply to a token check \(its figures"
    ):
        bounds_for("token", "bfloat16", {"min_cosine": 0.9})


def test_the_card_shows_each_figure_beside_the_bound_in_force() -> None:
    bounds = bounds_for("embeddings", "bfloat16", {"min_cosine": 0.995})
    figures = {"min_cosine": 0.9968, "mean_cosine": 0.99993, "neighbour_overlap": 0.97}
    card = Approximation("embeddings", 256, "bfloat16", figures, bounds).describe()
    assert card["min_cosine"] == 0.9968 and card["required"]["min_cosine"] == ">= 0.995"
    assert card["figures"]["min_cosine"] == {
        "value": 0.9968,
        "bound": ">= 0.995",
        "set_by": "operator",
        "default": ">= 0.9995",
    }
    assert card["figures"]["mean_cosine"] == {"value": 0.99993}  # reported, not bounded
    assert card["figures"]["neighbour_overlap"] == {"value": 0.97, "bound": ">= 0.95"}
    assert card["loosened"] == {"min_cosine": ">= 0.995"}
    plain = Approximation("embeddings", 256, "bfloat16", figures, bounds_for("embeddings", "bfloat16"))
    assert "loosened" not in plain.describe()


def test_a_refusal_names_the_figure_the_bound_and_the_option_that_would_accept_it() -> None:
    figures = {"min_cosine": 0.996808, "mean_cosine": 0.999926, "neighbour_overlap": 0.97}
    refused = Refused(
        Approximation("embeddings", 256, "bfloat16", figures, bounds_for("embeddings", "bfloat16"))
    )
    assert refused.short == "min_cosine 0.996808 (needs >= 0.9995)"
    assert (
        "min_cosine 0.996808 (needs >= 0.9995; --bound min_cosine=0.996808 or "
        "`bounds: {min_cosine: 0.996808}` in --models would accept it)"
    ) in refused.message
    ceiling = bounds_for("classify", "bfloat16", {"max_probability_delta": 0.01})
    high = Refused(
        Approximation(
            "classify", 256, "bfloat16", {"label_agreement": 1.0, "max_probability_delta": 0.0418591}, ceiling
        )
    )
    assert "(needs <= 0.01, set by the operator; --bound max_probability_delta=0.04186 " in high.message


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("min_cosin=0.9", r"min_cosin: 'min_cosin' is not a bound \(bounds: min_cosine"),
        ("min_cosine=high", r"min_cosine: 'high' is not a number"),
        ("min_cosine=1.5", r"min_cosine: 1.5 is out of range: min_cosine is between -1.0 and 1.0"),
        ("p99_probability_delta=nan", r"p99_probability_delta: nan is out of range"),
        ("min_cosine", r"give NAME=VALUE"),
    ],
)
def test_a_bad_bound_is_refused_naming_it(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_bound(text)


def test_parse_bound() -> None:
    assert parse_bound("min_cosine=0.995") == ("min_cosine", 0.995)
    assert parse_bound(" span_agreement = 0.98 ") == ("span_agreement", 0.98)


def test_a_models_file_sets_bounds_per_model(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n  - model: /srv/mpnet\n    bounds: {min_cosine: 0.995, neighbour_overlap: 0.9}\n"
        "  - model: /srv/minilm\n"
    )
    mpnet, minilm = (s.options for s in models_file(path))
    assert dict(mpnet.bounds) == {"min_cosine": 0.995, "neighbour_overlap": 0.9} and minilm.bounds == ()
    for bad, why in (
        ("{min_cosin: 0.9}", r"model '/srv/mpnet': bounds.min_cosin: 'min_cosin' is not a bound"),
        ("{min_cosine: high}", r"model '/srv/mpnet': bounds.min_cosine: 'high' is not a number"),
        ("{token_agreement: 2}", r"bounds.token_agreement: 2 is out of range"),
        ("{min_cosine: true}", r"bounds.min_cosine: True is not a number"),
    ):
        path.write_text(f"models:\n  - model: /srv/mpnet\n    bounds: {bad}\n")
        with pytest.raises(ConfigError, match=why):
            models_file(path)


def test_serve_and_worker_take_bounds_and_refuse_a_bad_one_naming_the_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from vllm_srun.cli.main import build_parser
    from vllm_srun.cli.startup import model_settings

    for command in (["serve"], ["worker", "--redis", "redis://localhost"]):
        argv = [*command, "/srv/a", "/srv/b", "--bound", "min_cosine=0.995", "--bound", "mean_cosine=0.999"]
        settings = model_settings(build_parser().parse_args(argv))
        assert [dict(s.options.bounds) for s in settings] == [{"min_cosine": 0.995, "mean_cosine": 0.999}] * 2
        with pytest.raises(SystemExit):
            build_parser().parse_args([*command, "/srv/a", "--bound", "min_cosine=2"])
        assert "argument --bound: min_cosine: 2 is out of range" in capsys.readouterr().err
