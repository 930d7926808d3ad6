"""Each answer the scheduler declares for executors' requests reads the asking executor from the subject that
contracts spell for it, and takes no other subject."""

from collections.abc import Callable
from typing import Any

import pytest

from contracts.subjects import fact_submissions, fleet_registrations, log_reads, object_requests, run_command
from services.runtime.nats.answers import Answer
from services.scheduler.desk import READS, SUBMISSIONS
from services.scheduler.objects import OBJECT_REQUESTS
from services.scheduler.registration import REGISTRATIONS
from tests.request_subjects import requester_of

ANSWERS: list[tuple[Callable[[str], str], Answer[Any]]] = [
    (fleet_registrations, REGISTRATIONS), (object_requests, OBJECT_REQUESTS), (fact_submissions, SUBMISSIONS),
    (log_reads, READS)]


@pytest.mark.parametrize(("spell", "answer"), ANSWERS)
def test_an_executors_request_subject_names_the_executor_that_asks(spell: Callable[[str], str],
                                                                   answer: Answer[Any]) -> None:
    assert requester_of(answer, spell("gpu_7-b")) == "gpu_7-b"


@pytest.mark.parametrize("subject", ["svc.fleet.register", "svc.objects.", "svc.objects.a.b", run_command("gpu-1"),
                                     "objects.gpu-1", "svc.log"])
@pytest.mark.parametrize(("spell", "answer"), ANSWERS)
def test_no_other_subject_names_an_asking_executor(subject: str, spell: Callable[[str], str],
                                                   answer: Answer[Any]) -> None:
    with pytest.raises(ValueError, match="request subject"):
        requester_of(answer, subject)
