"""CPU seconds a process has spent (user + system, from /proc through psutil): steadier than wall time on a shared
machine, so the benches compare these."""

import psutil


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)
