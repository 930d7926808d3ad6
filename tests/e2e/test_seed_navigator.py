"""The Navigator (LiteLLM-based) seed's walkthroughs, run as written with only the base URL, key and model changed:
lines name no model; the upload names it with the `x-litellm-model` header; the script polls 3 s apart
and reads every output line's choices."""

import io
import json
from time import sleep

import pytest
from openai import OpenAI

from tests.e2e.conftest import ADMIN_KEY, RunningStack

pytestmark = pytest.mark.e2e

CHECKS = 100
"""The seed's script checks 25 times, 3 s apart, on its GPUs; its lines set no max_tokens, so each answer runs to
the model's end of text or the slot's context, which on two shared CPU cores under the test suite takes longer."""
MODEL = "smollm2"  # the walkthrough's "gpt-oss-20b", as this deployment's catalogue names its model
SYSTEM = {"role": "system", "content": "You are an AI assistant that helps people find information."}
CHAT_FILE = "\n".join(json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                                  "body": {"messages": [SYSTEM, {"role": "user", "content": question}]}})
                      for custom_id, question in (("task-0", "When was Microsoft founded?"),
                                                  ("task-1", "When was the first XBOX released?"),
                                                  ("task-3", "Why is the sky blue?")))
RESPONSES_FILE = "\n".join(json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/responses",
                                       "body": {"input": [SYSTEM, {"role": "user", "content": question}]}})
                           for custom_id, question in (("task-0", "When was Microsoft founded?"),
                                                       ("task-1", "When was the first XBOX released?")))


def walkthrough(stack: RunningStack, content: str, endpoint: str) -> list[dict]:
    """The seed's script: upload with the model header, create, poll 3 s apart, read the output."""
    client = OpenAI(base_url=stack.base_url, api_key=ADMIN_KEY)
    batch_input_file = client.files.create(file=("batch.jsonl", io.BytesIO(content.encode()), "application/jsonl"),
                                           purpose="batch", extra_headers={"x-litellm-model": MODEL})
    batch = client.batches.create(input_file_id=batch_input_file.id, endpoint=endpoint,  # type: ignore[arg-type]
                                  completion_window="24h")
    for _ in range(CHECKS):
        batch_status = client.batches.retrieve(batch.id)
        if batch_status.status == "completed":
            break
        assert batch_status.status not in ("failed", "cancelled", "expired"), batch_status.model_dump()
        sleep(3)
    else:
        raise AssertionError(f"the batch did not complete within {CHECKS} checks: {batch_status}")
    assert batch_status.output_file_id is not None and batch_status.error_file_id is None, batch_status.model_dump()
    file_contents = client.files.content(batch_status.output_file_id).content.decode("utf-8")
    return [json.loads(line) for line in file_contents.strip().split("\n") if line]


def test_the_chat_walkthrough_runs_lines_without_a_model_on_the_model_named_at_upload(stack: RunningStack) -> None:
    results = walkthrough(stack, CHAT_FILE, "/v1/chat/completions")
    assert [result["custom_id"] for result in results] == ["task-0", "task-1", "task-3"]
    for result in results:
        assert not result["error"]
        choices = result["response"]["body"]["choices"]
        assert choices[0]["index"] == 0 and choices[0]["message"]["content"]
        assert result["response"]["body"]["model"] == "smollm2-135m-instruct-q4_1"


def test_the_responses_walkthrough_runs_lines_without_a_model_on_the_model_named_at_upload(
        stack: RunningStack) -> None:
    results = walkthrough(stack, RESPONSES_FILE, "/v1/responses")
    assert [result["custom_id"] for result in results] == ["task-0", "task-1"]
    for result in results:
        assert not result["error"] and result["response"]["body"]["object"] == "response"
