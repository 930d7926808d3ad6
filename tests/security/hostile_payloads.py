"""What a hostile executor sends in the fuzz of issue 27: for each subject its connection may publish to, random bytes
and broken JSON, or values that parse as the subject's contract but state nonsense (extreme counts and times, other
tenants' batches, files and objects, other executors' ids). Driven by one seeded `random.Random`: a seed replays it."""

import json
import random
import string
import time
import types
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from contracts.commands import AdmissionAsk, AdvertUpdate, ExecutorRegistration
from contracts.events.file import FileStored
from contracts.events.registry import AnyEvent
from contracts.fact_desk import ATTEMPT_FACTS, FINALIZER_FACTS, FactSubmission, FenceCondition, LogRead
from contracts.objects import ObjectRequest
from contracts.subjects import (
    admission_asks,
    advert_updates,
    attempt_failures,
    executor_acks,
    executor_pulls,
    fact_submissions,
    fleet_registrations,
    input_object_key,
    log_reads,
    object_requests,
    rejections_key,
    result_chunk_key,
    results_prefix,
)

MAX_BYTES = 60_000
"""Every message stays under this: the fuzz is about content, not the broker's payload limit."""
TEN_YEARS_MS = 10 * 365 * 24 * 3600 * 1000

Kind = Literal["register", "objects", "facts", "log", "advert", "admission", "pull", "ack", "other"]
EVENTS: tuple[type[BaseModel], ...] = get_args(get_args(AnyEvent)[0])
DESK_EVENTS = tuple(event for event in EVENTS
                    if getattr(event, "name", "") in (*ATTEMPT_FACTS, *FINALIZER_FACTS) or event is FileStored)
"""The facts the desk judges an executor's claim to: most submissions are one of these."""


def kind_of(subject: str, executor_id: str) -> Kind:
    """What an executor's permitted publish subject carries (`other`: one this fuzz does not know, sent junk)."""
    known: dict[str, Kind] = {fleet_registrations(executor_id): "register", object_requests(executor_id): "objects",
                              fact_submissions(executor_id): "facts", log_reads(executor_id): "log",
                              advert_updates(executor_id): "advert", admission_asks(executor_id): "admission",
                              executor_acks(executor_id): "ack"}
    if subject in known:
        return known[subject]
    if subject.startswith(f"{executor_pulls(executor_id)}.CONSUMER.MSG.NEXT."):
        return "pull"
    return "other"


@dataclass
class Targets:
    """What the attacker aims at: its own id and key, the stack's executor, and the victims' ids as they appear."""

    executor_id: str
    worker_key: str
    other_executors: list[str]
    batch_ids: list[str] = field(default_factory=lambda: ["batch_none"])
    file_ids: list[str] = field(default_factory=lambda: ["file-none"])
    key_ids: list[str] = field(default_factory=list)

    def object_keys(self, rng: random.Random) -> list[str]:
        batch, file = rng.choice(self.batch_ids), rng.choice(self.file_ids)
        return [input_object_key(file), results_prefix(batch), result_chunk_key(batch, rng.choice([0, 1, 2]), 0),
                rejections_key(batch), "", "files/", "results/", "../../etc/passwd", "/", "results/*", "files/>"]


class Hostile:
    """Payloads for one subject kind: half broken bytes, half contract-shaped values with hostile contents."""

    def __init__(self, rng: random.Random, targets: Targets) -> None:
        self.rng = rng
        self.targets = targets

    def payload(self, kind: Kind, subject: str) -> bytes:
        body = self._valid(kind, subject)
        if kind == "other" or self.rng.random() < 0.5:
            body = self.junk(body)
        return body[:MAX_BYTES]

    def concrete(self, subject: str) -> str:
        """A permitted subject with its wildcards filled in (an ack subject's sequence numbers)."""
        tokens: list[str] = []
        for token in subject.split("."):
            if token == ">":
                tokens.extend(str(self.number(small=True) % 10**9) for _ in range(self.rng.choice([1, 5, 5, 8])))
            elif token == "*":
                tokens.append(self.token())
            else:
                tokens.append(token)
        return ".".join(tokens)

    # -- contract-shaped, hostile contents

    def _valid(self, kind: Kind, subject: str) -> bytes:
        rng, targets = self.rng, self.targets
        if kind == "register":
            return self.model(ExecutorRegistration)
        if kind == "advert":
            return self.model(AdvertUpdate)
        if kind == "admission":
            return self.model(AdmissionAsk)
        if kind == "objects":
            return self.model(ObjectRequest)
        if kind == "log":
            return self.model(LogRead)
        if kind == "facts":
            events = DESK_EVENTS if rng.random() < 0.7 else EVENTS
            fence = None if rng.random() < 0.5 else FenceCondition(
                subject=rng.choice([attempt_failures(rng.choice(targets.batch_ids)), "evt.>", "", self.text()]),
                sequence=self.number())
            event = self.model(rng.choice(events)).decode(errors="replace")
            # Unvalidated: a fact of any length (the desk refuses one over `MAX_STATED_FACT_CHARS`).
            return FactSubmission.model_construct(event=event, fence=fence, then=[]).model_dump_json().encode()
        if kind == "pull":
            return json.dumps({"batch": self.number(), "expires": self.number(), "no_wait": rng.random() < 0.5,
                               "max_bytes": self.number(), "idle_heartbeat": self.number()}).encode()
        if kind == "ack":
            return rng.choice([b"+ACK", b"-NAK", b'-NAK {"delay": -5}', b"+TERM", b"+WPI", b"+NXT 100000", b""])
        return json.dumps(self.json_value(3)).encode()

    def model(self, contract: type[BaseModel]) -> bytes:
        """A value of `contract` with hostile contents; now and then its raw fields as they broke a bound."""
        data = self.fields(contract, tries=0 if self.rng.random() < 0.2 else 40)
        try:
            return contract.model_validate(data).model_dump_json().encode()
        except (ValueError, TypeError):
            return json.dumps(data, default=str).encode()

    def fields(self, contract: type[BaseModel], tries: int = 40) -> dict[str, Any]:
        """Hostile field values, each drawn again (up to `tries` rounds) while it breaks the contract's bounds."""
        fields = contract.model_fields
        data = {name: self.value(info.annotation, name) for name, info in fields.items()
                if info.is_required() or self.rng.random() < 0.7}
        for _ in range(tries):
            try:
                contract.model_validate(data)
                return data
            except ValidationError as error:
                broken = {str(problem["loc"][0]) for problem in error.errors() if problem["loc"]} & set(fields)
                for name in broken or set(data):
                    data[name] = self.value(fields[name].annotation, name)
        return data
    def value(self, annotation: Any, name: str) -> Any:
        rng, origin, args = self.rng, get_origin(annotation), get_args(annotation)
        if origin is Annotated:
            return self.value(args[0], name)
        if origin in (Union, types.UnionType):
            return self.value(rng.choice(args), name)
        if origin is Literal:
            return rng.choice(args)
        if origin is list:
            return [self.value(args[0], name) for _ in range(rng.choice([0, 1, 2, 3, 40]))]
        if origin is dict:
            return {self.text(): self.value(args[1], name) for _ in range(rng.choice([0, 1, 3]))}
        if annotation is type(None):
            return None
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return self.fields(annotation)
        if annotation is bool:
            return rng.random() < 0.5
        if annotation is int:
            return self.number()
        if annotation is float:
            return rng.choice([0.0, -1.0, 1e308, -1e308, 1e-308, rng.uniform(-1e6, 1e6)])
        return self.string(name)

    def string(self, name: str) -> str:
        rng, targets = self.rng, self.targets
        if rng.random() < 0.25:
            return self.text()
        if "executor" in name:
            return rng.choice([targets.executor_id, *targets.other_executors])
        if name == "worker_key":
            return targets.worker_key
        if "batch" in name or name in ("aggregate_id", "correlation_id", "causation_id"):
            return rng.choice(targets.batch_ids + targets.file_ids)
        if "file" in name:
            return rng.choice(targets.file_ids)
        if "owner" in name or "key_id" in name:
            return rng.choice(targets.key_ids or [self.token()])
        if "key" in name or name == "start_after" or "subject" in name:
            return rng.choice(targets.object_keys(rng))
        if name == "model" or "models" in name:
            return rng.choice(["smollm2", "smollm2-135m-instruct-q4_1", "*", self.text()])
        return self.text()

    def number(self, small: bool = False) -> int:
        now = int(time.time() * 1000)
        pool = [0, 1, 2, 7, -1, -(2**31), 2**31 - 1, 2**53 + 1, 2**63 - 1, 2**64, 10**12, -(10**12), now + TEN_YEARS_MS,
                now - TEN_YEARS_MS, now, self.rng.randint(-10**6, 10**6)]
        if not small:
            pool += [10**30, -(10**30), 10**300]
        return self.rng.choice(pool)

    def token(self) -> str:
        return "".join(self.rng.choices(string.ascii_letters + string.digits + "-_", k=self.rng.randint(1, 12)))

    def text(self) -> str:
        rng = self.rng
        return rng.choice([
            "", self.token(), "local-0", "x" * rng.choice([300, 5_000, 20_000]), "../" * 20, "evt.>", "*", ">",
            "\u0000\u0001\u202e\ufeff", "ä" * 100 + "😀" * 100, "${jndi:ldap://x}", "'; DROP TABLE facts; --",
            "".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 64)))])

    # -- broken

    def junk(self, sample: bytes) -> bytes:
        """Bytes that are not the contract: random, truncated, mutated, huge numbers, deep nesting, long strings."""
        rng = self.rng
        shape = rng.randrange(10)
        if shape == 0:
            return rng.randbytes(rng.choice([0, 1, 16, 1024, 50_000]))
        if shape == 1:
            return sample[:rng.randint(0, max(len(sample) - 1, 0))]
        if shape == 2:
            return json.dumps(self.json_value(rng.randint(0, 4))).encode()
        if shape == 3:
            depth = rng.choice([100, 1_000, 10_000, 25_000])
            return ("[" * depth + "]" * depth).encode() if rng.random() < 0.5 else \
                ('{"a":' * depth + "1" + "}" * depth)[:MAX_BYTES].encode()
        if shape == 4:
            digits = rng.choice([20, 400, 4_301, 20_000, 50_000])
            field_name = rng.choice(["attempt", "sequence", "after", "slots", "heartbeat_at", "completed"])
            return f'{{"{field_name}": {rng.choice(["", "-"])}{"9" * digits}}}'.encode()
        if shape == 5:
            return b'{"executor_id": "' + b"A" * 50_000 + b'"}'
        if shape == 6:
            return self.mutated(sample)
        if shape == 7:
            return rng.choice([b"null", b"[]", b'""', b"0", b"1e999", b"NaN", b"-Infinity", b"true", b"\xef\xbb\xbf{}",
                               b'{"a": 1, "a": 2}', b"{\"event\": \"\\ud800\"}", b"\xff\xfe\x00"])
        if shape == 8:
            position = rng.randrange(len(sample) + 1)
            return sample[:position] + rng.randbytes(rng.randint(1, 8)) + sample[position:]
        return json.dumps({"event": sample.decode(errors="replace")[::-1], "fence": self.json_value(2)}).encode()

    def mutated(self, sample: bytes) -> bytes:
        """The sample with one top-level field set to a value of another type."""
        try:
            data = json.loads(sample)
        except ValueError:
            return sample[::-1]
        if not isinstance(data, dict) or not data:
            return json.dumps([data]).encode()
        data[self.rng.choice(list(data))] = self.json_value(2)
        return json.dumps(data).encode()

    def json_value(self, depth: int) -> Any:
        rng = self.rng
        if depth <= 0 or rng.random() < 0.3:
            return rng.choice([None, True, False, self.number(), self.text(), rng.uniform(-1e9, 1e9)])
        if rng.random() < 0.5:
            return [self.json_value(depth - 1) for _ in range(rng.randint(0, 4))]
        return {self.text()[:40]: self.json_value(depth - 1) for _ in range(rng.randint(0, 4))}
