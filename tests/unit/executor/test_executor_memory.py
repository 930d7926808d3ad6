"""What an executor advertises of its GPUs, against a fake of NVML shaped as `nvidia-ml-py`'s `pynvml` (the calls
and `NVMLError` it raises): only the devices `CUDA_VISIBLE_DEVICES` lets it use, numbered as CUDA numbers them, and
a failing NVML never ends it nor passes the host's memory off as the GPU's."""

import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.executor.adapters import memory

GIB = 1024**3


class NVMLError(Exception):
    pass


class FakeNvml:
    """`pynvml`'s calls the executor makes; `fail_from` makes every memory read raise from then on."""

    NVMLError = NVMLError

    def __init__(self, devices: list[tuple[str, str, int, int]]) -> None:
        self.devices = devices  # (uuid, name, total, free)
        self.fail = False
        self.open = 0

    def nvmlInit(self) -> None:
        self.open += 1

    def nvmlShutdown(self) -> None:
        self.open -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.devices[handle][0]

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self.devices[handle][1].encode()

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        if self.fail:
            raise NVMLError("GPU is lost")
        _, _, total, free = self.devices[handle]
        return SimpleNamespace(total=total, free=free, used=total - free)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml([("GPU-aaaa-1111", "H200", 140 * GIB, 100 * GIB), ("GPU-bbbb-2222", "H200", 140 * GIB, 7 * GIB)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(memory, "_last_reading", [])
    monkeypatch.setattr(memory, "_told", set())
    return fake


def test_cuda_visible_devices_chooses_and_orders_devices_as_cuda_does() -> None:
    uuids = ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]
    assert memory.visible_devices(3, uuids, {}) == [0, 1, 2]
    assert memory.visible_devices(3, uuids, {"CUDA_VISIBLE_DEVICES": "2,0"}) == [2, 0]
    assert memory.visible_devices(3, uuids, {"CUDA_VISIBLE_DEVICES": "GPU-bb"}) == [1]
    assert memory.visible_devices(3, uuids, {"CUDA_VISIBLE_DEVICES": "1,7,0"}) == [1]  # CUDA stops at a bad one
    assert memory.visible_devices(3, uuids, {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert memory.visible_devices(3, uuids, {"CUDA_VISIBLE_DEVICES": "GPU-"}) == []  # ambiguous


def test_only_visible_gpus_are_advertised_numbered_from_zero(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    [device] = memory.device_memory()
    assert (device.name, device.total_bytes, device.free_bytes) == ("cuda:0 H200", 140 * GIB, 7 * GIB)
    assert nvml.open == 0  # NVML shut down after each reading


def test_an_nvml_failure_repeats_the_last_reading_and_never_raises(nvml: FakeNvml) -> None:
    good = memory.device_memory()
    assert [d.name for d in good] == ["cuda:0 H200", "cuda:1 H200"]
    nvml.fail = True
    assert memory.device_memory() == good
    assert nvml.open == 0


def test_an_nvml_that_never_read_falls_back_to_the_host(nvml: FakeNvml) -> None:
    nvml.fail = True
    [device] = memory.device_memory()
    assert device.name == "cpu"


class AbsentDriverNvml(FakeNvml):
    """`pynvml` installed on a host without NVIDIA's driver (a CPU host): initialising it fails."""

    def nvmlInit(self) -> None:
        raise NVMLError("Driver Not Loaded")


def nvml_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if "NVML" in record.getMessage()]


def test_a_cpu_host_says_nvml_is_absent_once_not_at_every_heartbeat(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", AbsentDriverNvml([]))
    monkeypatch.setattr(memory, "_told", set())
    with caplog.at_level(logging.DEBUG, logger=memory.__name__):
        readings = [memory.device_memory() for _ in range(5)]
    assert all([device.name for device in reading] == ["cpu"] for reading in readings)
    [said] = nvml_records(caplog)
    assert said.levelno == logging.INFO


def test_a_failing_nvml_warns_once_until_it_reads_again(nvml: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    memory.device_memory()
    with caplog.at_level(logging.DEBUG, logger=memory.__name__):
        nvml.fail = True
        for _ in range(5):
            memory.device_memory()
        nvml.fail = False
        memory.device_memory()
        nvml.fail = True
        memory.device_memory()
    assert [record.levelno for record in nvml_records(caplog)] == [logging.WARNING, logging.INFO, logging.WARNING]


def test_a_cpu_hosts_free_memory_counts_the_page_cache_the_kernel_gives_back(tmp_path: Path) -> None:
    """MemAvailable, not MemFree: on a busy host the cache leaves almost nothing free, and every executor would
    advertise the same few MiB (a tie that placed a small model on the largest executor)."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:           51200 kB\nMemAvailable:   20000000 kB\n")
    assert memory.host_memory(meminfo).free_bytes == 20_000_000 * 1024


def test_a_kernel_without_memavailable_falls_back_to_free_pages(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pages = {"SC_PAGE_SIZE": 4096, "SC_AVPHYS_PAGES": 777, "SC_PHYS_PAGES": 6_000_000}
    monkeypatch.setattr(memory.os, "sysconf", pages.__getitem__)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:           51200 kB\n")
    assert memory.host_memory(meminfo).free_bytes == 777 * 4096
    assert memory.host_memory(tmp_path / "absent").free_bytes == 777 * 4096
    assert memory.host_memory(meminfo).total_bytes == 6_000_000 * 4096
