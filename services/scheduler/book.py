"""The scheduler's view of every unfinished batch and the known fleet, folded from the event log."""

from dataclasses import dataclass, field
from typing import Literal

from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelled,
    BatchCancelRequested,
    BatchCompleted,
    BatchCreated,
    BatchExpired,
    BatchFailed,
    BatchReleased,
    BatchStarted,
    BatchValidated,
    BatchValidationFailed,
    BatchWaiting,
    CancelCode,
)
from contracts.events.executor import ExecutorLost, ExecutorRegistered
from contracts.events.registry import AnyEvent

Phase = Literal["validating", "validated", "running", "ended"]
ENDING_EVENTS = (BatchValidationFailed, BatchFailed, BatchCompleted, BatchCancelled, BatchExpired)


@dataclass
class BatchPlan:
    batch_id: str
    owner_key_id: str
    endpoint: str
    input_object_key: str
    expires_at: int
    """Seconds since the epoch."""
    phase: Phase = "validating"
    model: str | None = None
    total_lines: int = 0
    rejections_object_key: str | None = None
    attempt: int = 0
    """The highest attempt number assigned so far."""
    failed_attempts: set[int] = field(default_factory=set)
    executor_id: str | None = None
    tried_executors: set[str] = field(default_factory=set)
    running_since_ms: int = 0
    waiting_reason: str | None = None
    cancel_requested_at_ms: int | None = None
    cancel_code: CancelCode = "batch_cancelled"
    finalize_sent: bool = False
    held: bool = False
    """Created with `hold`: never assigned until released."""


@dataclass
class Book:
    plans: dict[str, BatchPlan] = field(default_factory=dict)
    known_executors: dict[str, int] = field(default_factory=dict)
    """Executor id → last heartbeat seen (ms), for every executor not declared lost since."""
    admitted: set[str] = field(default_factory=set)
    """Executors that registered with a worker key: the only ones given work."""
    incarnations: dict[str, int] = field(default_factory=dict)
    """Executor id → when its current process registered (ms); work assigned before that died with the old one."""

    def apply(self, event: AnyEvent) -> None:
        if isinstance(event, ExecutorRegistered):
            if event.worker_key_id is not None:
                self.known_executors[event.aggregate_id] = event.advert.heartbeat_at
                self.admitted.add(event.aggregate_id)
                self.incarnations[event.aggregate_id] = max(event.started_at,
                                                            self.incarnations.get(event.aggregate_id, 0))
            return
        if isinstance(event, ExecutorLost):
            if self.known_executors.get(event.aggregate_id, 0) <= event.last_heartbeat_at:
                self.known_executors.pop(event.aggregate_id, None)
            return
        if isinstance(event, BatchCreated):
            self.plans.setdefault(event.aggregate_id, BatchPlan(
                event.aggregate_id, event.owner_key_id, event.endpoint, event.input_object_key, event.expires_at,
                held=event.hold))
            return
        plan = self.plans.get(event.aggregate_id)
        if plan is None or plan.phase == "ended":
            return
        _apply_to_plan(plan, event)


def _apply_to_plan(plan: BatchPlan, event: AnyEvent) -> None:
    if isinstance(event, ENDING_EVENTS):
        plan.phase = "ended"
    elif isinstance(event, BatchValidated):
        if plan.phase == "validating":
            plan.phase = "validated"
        plan.model, plan.total_lines = event.model, event.total_lines
        plan.rejections_object_key = event.rejections_object_key
    elif isinstance(event, BatchAssigned) and event.attempt >= plan.attempt:
        if event.attempt not in plan.failed_attempts:
            plan.phase, plan.executor_id = "running", event.executor_id
            plan.running_since_ms = event.occurred_at
        plan.attempt = event.attempt
        plan.tried_executors.add(event.executor_id)
    elif isinstance(event, BatchStarted) and event.attempt == plan.attempt and plan.phase == "running":
        plan.executor_id = event.executor_id
    elif isinstance(event, AttemptFailed):
        plan.failed_attempts.add(event.attempt)
        if event.attempt == plan.attempt and plan.phase == "running":
            plan.phase, plan.executor_id = "validated", None
    elif isinstance(event, BatchCancelRequested):
        if plan.cancel_requested_at_ms is None:
            plan.cancel_requested_at_ms = event.occurred_at
        if event.code == "authorization_revoked":
            plan.cancel_code = event.code
    elif isinstance(event, BatchReleased):
        plan.held = False
    elif isinstance(event, BatchWaiting):
        plan.waiting_reason = event.reason
