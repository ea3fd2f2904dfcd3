"""How ``shardwise calibrate`` times a call: device time on a GPU (the profiler's kernel and copy durations), wall
time where that is the cost (CUDA events), the host clock on the CPU."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["MB", "TORCH_DTYPES", "Clock"]


TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


MB = 1 << 20


class Clock:
    """Milliseconds per call of ``fn`` (CUDA events on a GPU, the host clock on the CPU)."""

    def __init__(self, device: torch.device, reps: int) -> None:
        self.device = device
        self.reps = reps

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def ms(self, fn: Callable[[], Any], reps: int | None = None) -> float:
        """Device time per call on a GPU — the sum of the kernels' and copies' durations (torch.profiler), so that
        a call whose host work outlasts its kernels is not timed as host time; the host clock on the CPU."""
        n = reps or self.reps
        fn()
        self.sync()
        if self.device.type == "cuda":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    fn()
                self.sync()
            total_us = sum(e.self_device_time_total for e in prof.key_averages())
            return float(total_us) / 1e3 / n
        return self.wall_ms(fn, n)

    def wall_ms(self, fn: Callable[[], Any], reps: int | None = None) -> float:
        """Wall time per call of back-to-back calls (CUDA events on a GPU)."""
        n = reps or self.reps
        fn()
        self.sync()
        if self.device.type == "cuda":
            a = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            b = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            a.record()
            for _ in range(n):
                fn()
            b.record()
            b.synchronize()
            return float(a.elapsed_time(b)) / n
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) * 1e3 / n
