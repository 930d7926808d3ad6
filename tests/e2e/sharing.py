"""A stack shared by several owners, as the e2e tests and the chaos bench set it up: users of their own with an API
key each, and units of work small enough that every batch is many of them."""

from openai import OpenAI

from tests.e2e.conftest import RunningStack
from tests.e2e.test_fleet import api, chat_lines
from tests.factories import upload_when_key_known

SMALL_UNITS = {"SHESHNAG_SCHEDULER_UNIT_MIN_LINES": "4", "SHESHNAG_SCHEDULER_UNIT_MAX_LINES": "4",
               "SHESHNAG_EXECUTOR_CHUNK_LINES": "2"}
"""Units of 4 lines committed 2 at a time: even a short batch is many units, spread and re-leased line by line."""


def user_client(stack: RunningStack, user: str) -> OpenAI:
    """A client with an API key of a user of its own (an owner of its own), once the gateway knows the key."""
    api(stack, "POST", "/v1/organization/users", json={"id": user})
    key = str(api(stack, "POST", "/v1/organization/keys", json={"user_id": user, "name": f"{user} e2e"})["value"])
    client = stack.client(key)
    upload_when_key_known(client, chat_lines([f"{user}-key-known"]))
    return client
