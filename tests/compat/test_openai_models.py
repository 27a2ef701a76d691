"""Model identity through the real `openai` client: ids, aliases, retrieve, and requests that
name a model by an alias.

One server serves two models: a tiny embedding fixture resolved from a Hugging Face cache
with no name given (so its id is the repository id, with a slash), and all-MiniLM-L6-v2 from
a `--models` file that names it and gives it aliases.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import openai
import pytest
from helpers import Server, cache_package, minilm_dir, run_cli

from vllm_srun.testing.task_heads_fixtures import write_fixture

TINY = "acme/tiny-embed"
MINILM = "all-MiniLM-L6-v2"
MINILM_ALIASES = ["sentence-transformers/all-MiniLM-L6-v2", "minilm"]


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    root = tmp_path_factory.mktemp("identity")
    hub = root / "hub"
    cache_package(hub, TINY, "a" * 40, write_fixture(root / "tiny", variant="bert-embedding"))
    models = root / "models.yaml"
    models.write_text(
        f"models:\n  - model: {minilm_dir()!s}\n    name: {MINILM}\n"
        f"    aliases: [{', '.join(MINILM_ALIASES)}]\n"
    )
    return module_server(TINY, "--models", str(models), env={"HF_HUB_CACHE": str(hub)})


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_list_names_each_model_once_by_its_id(client: openai.OpenAI) -> None:
    models = list(client.models.list())
    assert [m.id for m in models] == [TINY, MINILM]
    assert all(m.object == "model" and m.owned_by == "vllm-srun" and m.created > 0 for m in models)
    by_id = {m.id: m for m in models}
    assert (by_id[MINILM].model_extra or {})["aliases"] == MINILM_ALIASES
    assert (by_id[TINY].model_extra or {})["aliases"] == []


@pytest.mark.parametrize("name", [TINY, MINILM, *MINILM_ALIASES])
def test_retrieve_by_id_or_alias_answers_the_model(client: openai.OpenAI, name: str) -> None:
    model = client.models.retrieve(name)
    assert model.id == (TINY if name == TINY else MINILM)
    assert model.object == "model" and (model.model_extra or {})["state"] == "ready"


def test_retrieve_an_unknown_model_is_a_404_in_our_error_shape(client: openai.OpenAI, server: Server) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("acme/absent")
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "model_not_found"
    raw = server.get("/v1/models/acme/absent")
    assert raw.status_code == 404 and raw.json()["error"]["code"] == "model_not_found"
    assert TINY in raw.json()["error"]["message"] and "minilm" in raw.json()["error"]["message"]


def test_an_alias_reaches_the_same_model(client: openai.OpenAI) -> None:
    texts = ["the cat sat on the mat", "a query about invoices"]
    by_id = client.embeddings.create(model=MINILM, input=texts, encoding_format="float")
    for alias in MINILM_ALIASES:
        by_alias = client.embeddings.create(model=alias, input=texts, encoding_format="float")
        assert by_alias.model == MINILM  # answered under the model's id, whatever it was called
        for a, b in zip(by_id.data, by_alias.data, strict=True):
            assert np.array_equal(np.asarray(a.embedding), np.asarray(b.embedding))
    tiny = client.embeddings.create(model=TINY, input=texts, encoding_format="float")
    assert tiny.model == TINY and len(tiny.data[0].embedding) != len(by_id.data[0].embedding)


def test_an_unknown_model_in_a_request_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="MiniLM", input="x")


def test_a_clashing_alias_refuses_the_start(tmp_path: Path) -> None:

    tiny = write_fixture(tmp_path / "tiny", variant="bert-embedding")
    models = tmp_path / "models.yaml"
    models.write_text(f"models:\n  - model: {minilm_dir()!s}\n    name: {MINILM}\n    aliases: [tiny]\n")
    result = run_cli("serve", str(tiny), "--models", str(models), "--port", "0", timeout=120)
    assert result.returncode != 0
    assert "'tiny' would name both 'tiny' and 'all-MiniLM-L6-v2'" in result.stderr, result.stderr
