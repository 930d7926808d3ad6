"""Which executor a request to one of the scheduler's answers names, read as the router reads it: for tests that
answer such requests on a bare subscription, without a broker's router."""

from services.runtime.nats.answers import Answer, Request


def requester_of(answer: Answer[Request], subject: str) -> str:
    """The executor a request names: the token its answer's declared subject (`svc.facts.{executor_id}`) holds as a
    path parameter, as the router reads it (only that executor may publish there)."""
    pattern, tokens = answer.subject.split("."), subject.split(".")
    named = [token for part, token in zip(pattern, tokens, strict=False) if part.startswith("{")]
    fixed = all(part == token for part, token in zip(pattern, tokens, strict=False) if not part.startswith("{"))
    if len(tokens) != len(pattern) or not fixed or len(named) != 1 or not named[0]:
        raise ValueError(f"{subject!r} is not a request subject of {answer.subject!r}")
    return named[0]
