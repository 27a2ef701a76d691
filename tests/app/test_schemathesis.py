"""The server agrees with its own OpenAPI document: schemathesis, every check, all three phases,
against real servers on cheap fixtures (the example keyword model; a tiny random BERT embedder,
which has a tokenizer for the TEI /tokenize and /decode routes; a tiny random BERT sequence
classifier), over the document they serve, /v1/jobs/{job_id}/events included.

A request the document allows is answered 2xx, or refused for what only the served model knows
(401, 404, 409, 413, 422, 424, 429): never 400, except for the few rules no schema can state,
each allowed by name in schemathesis_hooks.py. A request the document refuses is answered 4xx.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import Server, write_keywords

pytest.importorskip("schemathesis")

# Bounded by examples, not time (not --max-time: schemathesis keeps fuzzing until a time
# budget is spent). Most of a run is the coverage phase, which the bound does not shorten and
# whose length follows how busy the machine is, so the limit sits just below pytest's own
# (pyproject's timeout) rather than failing a slow machine.
MAX_EXAMPLES = 20
TIMEOUT_S = 240


CONFIG = """
[checks.positive_data_acceptance]
# A request the document allows may still be refused for what only the served model knows: a
# surface, head, layer, prompt, option or tokenizer it lacks (422 unsupported_surface, TEI's
# 424), a model or job that is not there (404), a bound (413, 429).
# No 400: the rules a schema cannot state are allowed one by one, by their error, in
# schemathesis_hooks.py (positive_data_acceptance_with_rules, which reads these statuses).
expected-statuses = ["2xx", "401", "404", "409", "413", "422", "424", "429"]

[checks.negative_data_rejection]
# Bodies decode strictly where the document gives a type, so a request it refuses is a 4xx.
expected-statuses = ["400", "401", "404", "405", "406", "409", "413", "415", "422", "424", "429"]
"""
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")

# Each operation is run against the servers whose model changes its answers, not against all
# three: the keyword model's run covers every operation; the embedder's and the classifier's
# leave out the operations that answer alike whatever the model (health, metrics, a job by its
# id), and the classifier's also the embedding and tokenizer routes, which the embedder's run
# covers with the same BERT tokenizer.
MODEL_INDEPENDENT = r"^/(health|health/live|ping|metrics|infinity/health|v1/jobs/.*)$"
EMBEDDING_ONLY = (
    r"^/(embed|embed_all|embed_sparse|embeddings|pooling|similarity|tokenize|decode"
    r"|v1/embed|v1/embeddings|v2/embed|infinity/embeddings|vllm/embeddings|vllm/v1/embeddings|vllm/pooling)$"
)
LEFT_OUT = {
    "keywords": None,
    "embedder": MODEL_INDEPENDENT,
    "classifier": f"{MODEL_INDEPENDENT}|{EMBEDDING_ONLY}",
}


def schemathesis_run(
    server: Server, tmp_path: Path, exclude: str | None = None
) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    st = shutil.which("st") or shutil.which("schemathesis")
    command = [st] if st else [sys.executable, "-m", "schemathesis.cli"]
    return subprocess.run(
        [
            *command,
            "--config-file",
            str(config),
            "--no-color",
            "run",
            f"{server.url}/openapi.json",
            "--checks",
            "all",
            # Its own check in schemathesis_hooks.py, the same with the named rules allowed.
            "--exclude-checks",
            "positive_data_acceptance",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--phases",
            "examples,coverage,fuzzing",
            # One worker: schemathesis's workers are threads, and Python 3.11 before 3.11.9 tracks the
            # depth of ast.parse in one global, so two threads describing strategies at once can fail
            # with "AST constructor recursion depth mismatch" (CPython gh-106905), failing the run.
            "--workers",
            "1",
            "--seed",
            "1",
            "--generation-database",
            "none",
            "--request-timeout",
            "30",
            *(["--exclude-path-regex", exclude] if exclude else []),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=tmp_path,
        env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)},
    )


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    root = tmp_path_factory.mktemp("pkgs")
    return {
        "keywords": write_keywords(root / "kw"),
        "embedder": write_fixture(root / "emb", variant="bert-embedding"),
        "classifier": write_fixture(root / "seq", variant="bert-sequence"),
    }


@pytest.mark.parametrize("model", ["keywords", "embedder", "classifier"])
def test_server_agrees_with_its_document(
    model: str,
    packages: dict[str, Path],
    module_server: Callable[..., Server],
    tmp_path: Path,
) -> None:
    server = module_server(str(packages[model]), "--served-model-name", model)
    result = schemathesis_run(server, tmp_path, LEFT_OUT[model])
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-4000:]
    assert "passed" in result.stdout, result.stdout[-4000:]
