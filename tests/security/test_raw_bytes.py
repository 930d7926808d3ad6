"""Attack: send bytes that are no text (invalid UTF-8, control characters, NUL, percent-escapes of both) in every
path parameter, query parameter and header the API reads, to make a handler fail on them. Each must be a 4xx in
OpenAI's error shape: never a 5xx, never a hang, never plain text."""

import json
import re
import secrets
import socket

import httpx2
import pytest

from tests.security.conftest import ADMIN_KEY, RunningStack

HOSTILE = [b"\xff\xfe", b"\xc3\x28", b"a\x01b", b"\x1b[31m", b"%ff%fe", b"%00", b"%c3%28", b"%0d%0aX-Injected:%201",
           b"\xed\xa0\x80"]
"""Raw in a request line or header value (a request line cannot hold a space, a header line no CR/LF). Bad bytes in
the Authorization header are `test_brute_force`'s: here they would spend this address's budget of wrong keys."""
HEADERS = [b"Content-Type", b"Accept", b"Idempotency-Key", b"Last-Event-ID", b"X-Request-Id",
           b"OpenAI-Organization", b"X-LiteLLM-Model", b"Origin", b"Cookie", b"If-None-Match", b"Range",
           b"X-Forwarded-For"]
ALLOWED = {400, 401, 403, 404, 405, 409, 413, 415, 422, 429}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def send(port: int, method: bytes, target: bytes, headers: list[bytes]) -> tuple[int, bytes, bytes]:
    """Send one request as raw bytes; its status, content type and body."""
    head = b"\r\n".join([method + b" " + target + b" HTTP/1.1", b"Host: x", *headers, b"Content-Length: 2",
                         b"Connection: close"])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(head + b"\r\n\r\n{}")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    header_block, _, body = rest.partition(b"\r\n\r\n")
    match = re.search(rb"(?im)^content-type:\s*([^;\r\n]+)", header_block)
    return int(status_line.split(b" ")[1]), match.group(1) if match else b"", body


def assert_openai_refusal(answer: tuple[int, bytes, bytes], what: str) -> None:
    status, content_type, body = answer
    assert status in ALLOWED, f"{what}: {status} {body[:300]!r}"
    assert content_type == b"application/json", f"{what}: {content_type!r} {body[:300]!r}"
    error = json.loads(body)["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert set(error) >= {"message", "type", "param", "code"}, f"{what}: {error}"


@pytest.fixture(scope="module")
def user_key(secure_stack: RunningStack) -> str:
    with httpx2.Client(base_url=secure_stack.base_url, timeout=30) as http:
        user_id = f"u-{secrets.token_hex(4)}"
        assert http.post("/organization/users", json={"id": user_id}, headers=bearer(ADMIN_KEY)).status_code == 200
        made = http.post("/organization/keys", json={"user_id": user_id}, headers=bearer(ADMIN_KEY))
        assert made.status_code == 200, made.text
        return str(made.json()["value"])


@pytest.fixture(scope="module")
def operations(secure_stack: RunningStack) -> list[tuple[bytes, str, list[str]]]:
    """Every (method, path template, query parameters) the deployment's OpenAPI document declares."""
    with httpx2.Client(base_url=secure_stack.base_url, timeout=30) as http:
        spec = http.get(f"http://127.0.0.1:{secure_stack.port}/openapi.json").json()
    found = []
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method in {"get", "post", "delete", "put", "patch"}:
                queries = [p["name"] for p in [*item.get("parameters", []), *operation.get("parameters", [])]
                           if p.get("in") == "query"]
                found.append((method.upper().encode(), path, queries))
    assert len(found) > 20
    return found


def targets(path: str, bad: bytes) -> list[bytes]:
    """The path with each of its parameters in turn (or its last segment, if it has none) made of `bad`."""
    names = re.findall(r"\{([^}]+)\}", path)
    if not names:
        return [path.encode() + b"/" + bad]
    made = []
    for name in names:
        filled = path.encode()
        for other in names:
            filled = filled.replace(b"{" + other.encode() + b"}", bad if other == name else b"x")
        made.append(filled)
    return made


def concrete(path: str) -> bytes:
    return re.sub(r"\{[^}]+\}", "x", path).encode()


def test_hostile_bytes_in_any_path_parameter_are_refused_in_openai_shape(
        secure_stack: RunningStack, user_key: str, operations: list[tuple[bytes, str, list[str]]]) -> None:
    auth = b"Authorization: Bearer " + user_key.encode()
    for method, path, _ in operations:
        for bad in HOSTILE:
            for target in targets(path, bad):
                assert_openai_refusal(send(secure_stack.port, method, target, [auth]), f"{method!r} {target!r}")


def test_hostile_bytes_in_any_query_parameter_are_refused_or_ignored_never_a_server_error(
        secure_stack: RunningStack, user_key: str, operations: list[tuple[bytes, str, list[str]]]) -> None:
    auth = b"Authorization: Bearer " + user_key.encode()
    for method, path, queries in operations:
        for name in [*queries, "limit", "after", "unknown"]:
            for bad in HOSTILE:
                target = concrete(path) + b"?" + name.encode() + b"=" + bad
                status, content_type, body = send(secure_stack.port, method, target, [auth])
                if status < 300:  # a parameter the operation ignores, or a value it reads as text
                    continue
                assert_openai_refusal((status, content_type, body), f"{method!r} {target!r}")


@pytest.mark.parametrize("bad", HOSTILE, ids=[repr(b) for b in HOSTILE])
def test_hostile_bytes_in_any_header_are_refused_or_ignored_never_a_server_error(
        secure_stack: RunningStack, user_key: str, operations: list[tuple[bytes, str, list[str]]], bad: bytes) -> None:
    auth = b"Authorization: Bearer " + user_key.encode()
    for method, path, _ in operations:
        target = concrete(path)
        for name in HEADERS:
            status, content_type, body = send(secure_stack.port, method, target, [auth, name + b": " + bad])
            if status < 300:
                continue
            assert_openai_refusal((status, content_type, body), f"{method!r} {target!r} {name!r}: {bad!r}")
