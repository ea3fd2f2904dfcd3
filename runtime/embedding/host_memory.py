"""Pinned host memory that GPU kernels read and write in place (zero-copy), for ``host`` and ``uvm_cache`` shards.

A tensor in pinned (page-locked) host memory is reachable from the GPU: the driver maps it into the device's
address space, and a kernel that dereferences the mapped address reads or writes the host's DRAM across the host
link, one transaction per access, with no copy in between. :func:`device_view` gives such memory as a CUDA tensor::

    store = pinned_empty((rows, cols), torch.float16, torch.device("cuda"))  # pinned host memory
    view = device_view(store, torch.device("cuda"))                           # the same bytes, as a CUDA tensor
    pooled = F.embedding_bag(ids, view, offsets, mode="sum")                  # a GPU kernel reads host rows
    store[0]  # the host sees what kernels wrote (after the stream that wrote it is synchronised)

This is FBGEMM's ``EmbeddingLocation.HOST_MAPPED`` / ``MANAGED`` for a GPU table (``new_host_mapped_tensor``:
``cudaHostAlloc(cudaHostAllocMapped | cudaHostAllocWriteCombined)`` then ``cudaHostGetDevicePointer``), made from
torch's own pinned allocator (``pin_memory=True``, ``cudaHostAlloc``) and its ``__cuda_array_interface__``
constructor, so the memory stays torch's: freed when the host tensor and every view of it are gone.

Why not the CPU: a ``host`` shard's rows were first gathered by the CPU (its ids copied to the host, a CPU
``index_select``, the rows copied up). Reading the rows through the mapping is faster at every size measured, and
it needs no host synchronisation (``docs/truth.md``, "Host rows read from the GPU", holds the times, from
``benchmarks/port_measured.py``). So on CUDA the executor reads host rows zero-copy, and
``apply_plan(host_access="cpu")`` keeps the CPU gather for comparison.

The device pointer is asked of the CUDA runtime (``cudaHostGetDevicePointer`` from the ``libcudart`` torch loads);
where no runtime library can be found, the host pointer itself is used: under unified virtual addressing (every
64-bit Linux CUDA system) pinned host memory has the same address on the host and on every device.
"""

from __future__ import annotations

import ctypes
import glob
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["device_view", "is_mapped", "pinned_empty", "pinned_zeros"]


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised host tensor, pinned when ``device`` is CUDA (pinning needs a CUDA runtime)."""
    return torch.empty(shape, dtype=dtype, pin_memory=device.type == "cuda")


def pinned_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """:func:`pinned_empty`, zeroed."""
    return torch.zeros(shape, dtype=dtype, pin_memory=device.type == "cuda")


class _Interface:
    """``__cuda_array_interface__`` over the bytes of a pinned host tensor; holds the tensor, and torch holds this
    object for as long as the storage it builds from it lives (so the host memory outlives every view)."""

    def __init__(self, host: Tensor, pointer: int) -> None:
        self.owner = host
        self.__cuda_array_interface__ = {
            "shape": (host.numel() * host.element_size(),),
            "typestr": "|u1",
            "data": (pointer, False),
            "version": 3,
            "strides": None,
        }


def device_view(host: Tensor, device: torch.device) -> Tensor:
    """``host`` (a contiguous, pinned CPU tensor) as a tensor on ``device`` (CUDA) over the same memory.

    Shape and dtype are ``host``'s (the view is built over its bytes, then reinterpreted, so every dtype works,
    bfloat16 included). A view of zero bytes is an ordinary empty device tensor. Kernels on any stream read and
    write it in place; the host sees their writes once the stream is synchronised.
    """
    if device.type != "cuda":
        raise ValueError(f"a zero-copy view needs a CUDA device, got {device}")
    if host.device.type != "cpu" or not host.is_contiguous():
        raise ValueError("a zero-copy view needs a contiguous CPU tensor")
    if host.numel() == 0:
        return torch.empty(host.shape, dtype=host.dtype, device=device)
    if not host.is_pinned():
        raise ValueError("a zero-copy view needs pinned host memory (pin_memory=True)")
    with torch.cuda.device(device):
        raw = torch.as_tensor(_Interface(host, _device_pointer(host.data_ptr())), device=device)
    return raw.view(host.dtype).view(host.shape)


def is_mapped(t: Tensor) -> bool:
    """Whether CUDA tensor ``t`` lies in host memory (a :func:`device_view`), as the CUDA runtime reports it."""
    lib = _cudart()
    if t.device.type != "cuda" or lib is None or t.numel() == 0:
        return False

    class _Attributes(ctypes.Structure):
        _fields_ = [
            ("type", ctypes.c_int),
            ("device", ctypes.c_int),
            ("devicePointer", ctypes.c_void_p),
            ("hostPointer", ctypes.c_void_p),
            ("reserved", ctypes.c_long * 32),  # room for fields a later CUDA adds (13 has reserved words)
        ]

    attributes = _Attributes()
    if lib.cudaPointerGetAttributes(ctypes.byref(attributes), ctypes.c_void_p(t.data_ptr())) != 0:
        return False
    return bool(attributes.type == 1)  # cudaMemoryTypeHost


def _device_pointer(host_pointer: int) -> int:
    lib = _cudart()
    if lib is None:  # unified virtual addressing: the host address is the device address
        return host_pointer
    out = ctypes.c_void_p()
    err = lib.cudaHostGetDevicePointer(ctypes.byref(out), ctypes.c_void_p(host_pointer), 0)
    if err != 0 or out.value is None:
        raise RuntimeError(f"cudaHostGetDevicePointer failed (error {err}): the memory is not mapped for the GPU")
    return int(out.value)


@lru_cache(maxsize=1)
def _cudart() -> Any:
    """The CUDA runtime library torch uses (its wheel's ``nvidia/.../libcudart.so*``, else the system's), or None."""
    base = Path(torch.__file__).resolve().parent.parent / "nvidia"
    candidates = sorted(glob.glob(str(base / "cu*" / "lib" / "libcudart.so*")))
    candidates += sorted(glob.glob(str(base / "cuda_runtime" / "lib" / "libcudart.so*")))
    candidates.append("libcudart.so")
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None
