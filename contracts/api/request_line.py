"""What one line of a batch input file must hold, and how long and deep it may be."""

REQUIRED_LINE_FIELDS: tuple[str, ...] = ("custom_id", "method", "url", "body")
MAX_CUSTOM_ID_LENGTH = 512
MAX_LINE_BYTES = 1024 * 1024
"""The longest line validation accepts by default (`invalid_json_line` past it; a deployment may only lower it):
the gateway counts no worst case for a longer line, which never runs."""
MAX_NESTING_DEPTH = 64
"""Arrays and objects nested in one line, the line itself counted. Every later stage must re-serialise a body:
orjson dumps at most 254 levels, the stdlib `json` about 1,000, llama.cpp's grammar builder recurses per level."""

MAX_SAMPLES = 64
"""The most completions one line may ask for (`n`): validation refuses more, and every later stage relies on it."""


def completion_prompts(prompt: object) -> int:
    """How many prompts a completions body's `prompt` holds: one answer (choice) each. A list of texts or of token
    lists holds one per item; a text or one list of token ids is one prompt."""
    if isinstance(prompt, list) and prompt and all(isinstance(item, (str, list)) for item in prompt):
        return len(prompt)
    return 1
