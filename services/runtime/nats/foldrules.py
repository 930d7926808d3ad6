"""A fold written as a table of rules: one small function per event type, registered with `@rules.on(Type)` (the
ledger, the scheduler's book, the executor's attempt log and the timeline all fold this way)."""

from collections.abc import Callable
from typing import Generic, TypeVar

R = TypeVar("R")


class FoldRules(Generic[R]):
    """Event type → the function that folds it; a type without a rule of its own takes its nearest base's. Lookups
    are by exact type and cached: a long fold pays one dictionary lookup per event, not a ladder."""

    def __init__(self) -> None:
        self._rules: dict[type, Callable[..., R]] = {}
        self._resolved: dict[type, Callable[..., R] | None] = {}

    def on(self, *event_types: type) -> Callable[[Callable[..., R]], Callable[..., R]]:
        """Register the decorated function as the rule for each of `event_types` (one rule per type)."""

        def register(rule: Callable[..., R]) -> Callable[..., R]:
            for event_type in event_types:
                if event_type in self._rules:
                    raise ValueError(f"{event_type.__name__} already has a rule: {self._rules[event_type].__name__}")
                self._rules[event_type] = rule
            self._resolved.clear()
            return rule

        return register

    def rule_for(self, event_type: type) -> Callable[..., R] | None:
        """The rule that folds events of `event_type`; None when the fold leaves them alone."""
        try:
            return self._resolved[event_type]
        except KeyError:
            rule = next((self._rules[base] for base in event_type.__mro__ if base in self._rules), None)
            self._resolved[event_type] = rule
            return rule

    def types(self) -> tuple[type, ...]:
        """The event types with a rule of their own, in registration order (what the fold consumes)."""
        return tuple(self._rules)

    def __contains__(self, event_type: type) -> bool:
        return self.rule_for(event_type) is not None
