"""The memory an executor advertises: the GPUs `CUDA_VISIBLE_DEVICES` lets it use, through NVML, else the host's. A
failing NVML repeats its last good reading (never the host's RAM as the GPU's); read at every heartbeat, its absence or
failure is logged once."""

import contextlib
import importlib
import logging
import os
from pathlib import Path
from typing import Any

from contracts.events.executor import DeviceMemory

log = logging.getLogger(__name__)
_last_reading: list[DeviceMemory] = []
"""The last GPU reading NVML gave, repeated while it fails."""
_told: set[str] = set()
"""What this process has logged about NVML already ("absent", "failing"): said once, not at every heartbeat."""


def _tell_once(what: str, level: int, message: str, *args: object) -> None:
    if what not in _told:
        _told.add(what)
        log.log(level, message, *args)


def host_memory(meminfo: Path = Path("/proc/meminfo")) -> DeviceMemory:
    """The host's memory; free is MemAvailable (counting droppable page cache), not MemFree (near 0 on a busy host)."""
    page = os.sysconf("SC_PAGE_SIZE")
    free = os.sysconf("SC_AVPHYS_PAGES") * page
    with contextlib.suppress(OSError, ValueError):
        for line in meminfo.read_text().splitlines():
            name, _, amount = line.partition(":")
            if name == "MemAvailable":
                free = int(amount.split()[0]) * 1024  # kB
    return DeviceMemory(name="cpu", total_bytes=os.sysconf("SC_PHYS_PAGES") * page, free_bytes=free)


def _nvml() -> Any | None:
    """The NVML bindings, initialised, or None where they or the driver are absent."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:  # the driver or the device is missing: no NVIDIA GPU to advertise
        _tell_once("absent", logging.INFO, "NVML present but unusable (%r): no NVIDIA GPU, advertising host memory "
                                           "(said once)", error)
        return None
    return nvml


def visible_devices(count: int, uuids: list[str], environ: dict[str, str] | None = None) -> list[int]:
    """The NVML indices CUDA lets this process use, in CUDA's order: `CUDA_VISIBLE_DEVICES` lists indices or UUIDs
    (prefixes allowed); CUDA stops at the first entry it cannot resolve. Unset: every device."""
    chosen = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if chosen is None:
        return list(range(count))
    visible: list[int] = []
    for entry in (part.strip() for part in chosen.split(",")):
        if entry.isdigit() and int(entry) < count:
            index = int(entry)
        else:
            matches = [i for i, uuid in enumerate(uuids) if entry and uuid.startswith(entry)]
            if len(matches) != 1:
                break
            index = matches[0]
        if index in visible:
            break
        visible.append(index)
    return visible


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_memory() -> list[DeviceMemory]:
    nvml = _nvml()
    if nvml is None:
        return []
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(nvml.nvmlDeviceGetCount())]
        uuids = [_text(nvml.nvmlDeviceGetUUID(handle)) for handle in handles]
        devices = []
        for position, index in enumerate(visible_devices(len(handles), uuids)):
            info = nvml.nvmlDeviceGetMemoryInfo(handles[index])
            label = _text(nvml.nvmlDeviceGetName(handles[index]))
            devices.append(DeviceMemory(name=f"cuda:{position} {label}", total_bytes=int(info.total),
                                        free_bytes=int(info.free)))
        _last_reading[:] = devices
        if "failing" in _told:
            _told.discard("failing")
            log.info("NVML reads GPU memory again")
        return devices
    except nvml.NVMLError as error:
        _tell_once("failing", logging.WARNING, "NVML failed while reading GPU memory (%r); advertising the last "
                                               "reading until it reads again", error)
        return list(_last_reading)
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def device_memory() -> list[DeviceMemory]:
    """Each visible NVIDIA GPU's total and free memory; the host's memory on a CPU host."""
    return gpu_memory() or [host_memory()]


def within_budget(devices: list[DeviceMemory], budget_mb: int | None, loaded_bytes: int) -> list[DeviceMemory]:
    """The devices as advertised under a memory budget: at most the budget, less what the loaded models take."""
    if budget_mb is None:
        return devices
    budget = budget_mb * 1024 * 1024
    return [DeviceMemory(name=f"{device.name} (budget {budget_mb} MiB)", total_bytes=min(budget, device.total_bytes),
                         free_bytes=max(0, min(budget - loaded_bytes, device.free_bytes))) for device in devices]
