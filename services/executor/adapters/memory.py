"""The memory an executor advertises: NVIDIA GPUs through NVML when it is there, else the host's memory."""

import importlib
import logging
import os
from typing import Any

from contracts.events.executor import DeviceMemory

log = logging.getLogger(__name__)


def host_memory() -> DeviceMemory:
    page = os.sysconf("SC_PAGE_SIZE")
    return DeviceMemory(name="cpu", total_bytes=os.sysconf("SC_PHYS_PAGES") * page,
                        free_bytes=os.sysconf("SC_AVPHYS_PAGES") * page)


def _nvml() -> Any | None:
    """The NVML bindings (`nvidia-ml-py`), initialised, or None where they or the driver are absent."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:  # the driver or the device is missing: no NVIDIA GPU to advertise
        log.info("NVML present but unusable (%r); advertising host memory", error)
        return None
    return nvml


def gpu_memory() -> list[DeviceMemory]:
    nvml = _nvml()
    if nvml is None:
        return []
    try:
        devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            label = name.decode() if isinstance(name, bytes) else str(name)
            devices.append(DeviceMemory(name=f"cuda:{index} {label}", total_bytes=int(info.total),
                                        free_bytes=int(info.free)))
        return devices
    finally:
        nvml.nvmlShutdown()


def device_memory() -> list[DeviceMemory]:
    """Each NVIDIA GPU's total and free memory; the host's memory on a CPU host."""
    return gpu_memory() or [host_memory()]


def within_budget(devices: list[DeviceMemory], budget_mb: int | None, loaded_bytes: int) -> list[DeviceMemory]:
    """The devices as advertised under an operator's memory budget: no more than the budget in total, less what
    the loaded models already take."""
    if budget_mb is None:
        return devices
    budget = budget_mb * 1024 * 1024
    return [DeviceMemory(name=f"{device.name} (budget {budget_mb} MiB)", total_bytes=min(budget, device.total_bytes),
                         free_bytes=max(0, min(budget - loaded_bytes, device.free_bytes))) for device in devices]
