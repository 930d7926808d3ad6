"""A supervised server for the watches' tests: it counts the stops a watch asks of it."""

from dataclasses import dataclass


@dataclass
class FakeServer:
    name: str
    restarts: int = 0
    stops: int = 0

    def stop(self, within_s: float = 10.0) -> None:
        self.stops += 1

    def start(self) -> None:
        pass
