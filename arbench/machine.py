"""Names of the hardware a run used, for reports: the CPU model or the GPU."""

from __future__ import annotations

import platform

import torch


def cpu_name() -> str:
    """The CPU model from ``/proc/cpuinfo`` (Linux), else what ``platform`` reports."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def device_name(device: str | torch.device) -> str:
    """``"cuda: <GPU name>"`` for a CUDA device, ``"cpu: <model>"`` for the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    if device.type == "cpu":
        return f"cpu: {cpu_name()}"
    return device.type


__all__ = ["cpu_name", "device_name"]
