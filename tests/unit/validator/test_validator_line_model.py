"""Which model a line without `body.model` runs on: the one the batch names for all (its `metadata.model`, or the
model named at upload: LiteLLM's `x-litellm-model`), or — where the deployment inherits it — the first one an
earlier line named; otherwise, as OpenAI has it, the line must name its own."""

import orjson

from contracts.catalogue import Catalogue
from services.validator.domain import FileValidation, Limits

CHAT = "/v1/chat/completions"
CHAT_MODEL = "smollm2-135m-instruct-q4_1"


def line(custom_id: str, model: str | None = None) -> bytes:
    body: dict[str, object] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    if model is not None:
        body["model"] = model
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body})


def issues(validation: FileValidation, *lines: bytes) -> list[list[tuple[str, str | None]]]:
    return [[(issue.code, issue.param) for issue in result.issues]
            for result in validation.check_window(list(enumerate(lines, start=1)))]


def test_without_a_batch_model_every_line_must_name_one(catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue)
    assert issues(validation, line("a", "smollm2"), line("b")) == [[], [("missing_model", "body.model")]]


def test_lines_without_a_model_run_on_the_one_named_at_upload_and_lines_naming_it_agree(
        catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue, default_model="smollm2")
    assert issues(validation, line("a"), line("b", CHAT_MODEL), line("c")) == [[], [], []]
    assert validation.passed and validation.model_id == CHAT_MODEL


def test_a_line_naming_another_model_than_the_batchs_is_a_model_mismatch(catalogue: Catalogue) -> None:
    chat = catalogue.resolve(CHAT_MODEL)
    assert chat is not None
    twin = chat.model_copy(update={"id": "smollm2-twin", "aliases": []})
    validation = FileValidation(CHAT, Catalogue(models=[chat, twin]), default_model=CHAT_MODEL)
    [named_twin, named_none] = validation.check_window([(1, line("a", "smollm2-twin")), (2, line("b"))])
    assert [(issue.code, issue.param) for issue in named_twin.issues] == [("model_mismatch", "body.model")]
    assert "the batch's model is smollm2-135m-instruct-q4_1" in named_twin.issues[0].message
    assert named_none.issues == []


def test_a_batch_model_the_catalogue_does_not_serve_refuses_only_the_lines_that_rely_on_it(
        catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue, default_model="gpt-4o")
    found = validation.check_window([(1, line("a", "smollm2")), (2, line("b"))])
    assert [[issue.code for issue in result.issues] for result in found] == [[], ["unsupported_model"]]
    assert "the batch's model" in found[1].issues[0].message
    assert validation.model_id == CHAT_MODEL, "a label the catalogue does not know pins nothing"


def test_where_the_deployment_inherits_a_line_takes_the_model_an_earlier_line_named(catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue, Limits(inherit_line_model=True))
    # in one window (the first naming line not yet pinned) and across windows
    assert issues(validation, line("a", "smollm2"), line("b")) == [[], []]
    assert issues(validation, line("c")) == [[]]
    assert validation.passed and validation.model_id == CHAT_MODEL


def test_where_the_deployment_inherits_a_line_before_any_named_model_still_needs_one(catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue, Limits(inherit_line_model=True))
    assert issues(validation, line("a"), line("b", "smollm2")) == [[("missing_model", "body.model")], []]
