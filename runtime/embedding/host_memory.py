"""Host memory that GPU kernels read and write in place (zero-copy), for ``host`` and ``uvm_cache`` shards.

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

**Managed memory for the rows a kernel reads at random** (:func:`managed_empty`): a ``host`` group's weight and
per-weight state are CUDA managed memory (``cudaMallocManaged``) whose preferred location is the CPU and which the
GPU maps (``cudaMemAdviseSetPreferredLocation`` the CPU, ``cudaMemAdviseSetAccessedBy`` the device) — FBGEMM's
``new_managed_tensor``, what TorchRec's ``fused_uvm`` tables run on. The pages stay in host DRAM (the driver maps
them for the GPU instead of moving them: no device memory is taken, which a capped device needs) and kernels read
them across the host link as they read pinned memory. The difference is measured, not derived: with a table's hot
rows scattered over gigabytes, the lookup and the update read pinned memory 1.3–1.8× slower than managed memory
(``docs/benchmarks.md``, "Host rows: managed memory"). Where the runtime refuses managed memory, the group falls
back to pinned memory and its device view.

The device pointer is asked of the CUDA runtime (``cudaHostGetDevicePointer`` from the ``libcudart`` torch loads);
where no runtime library can be found, the host pointer itself is used: under unified virtual addressing (every
64-bit Linux CUDA system) pinned host memory has the same address on the host and on every device.
"""

from __future__ import annotations

import ctypes
import glob
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["RawMemory", "device_view", "is_mapped", "managed_empty", "managed_zeros", "pinned_empty", "pinned_zeros"]


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised host tensor, pinned when ``device`` is CUDA (pinning needs a CUDA runtime)."""
    return torch.empty(shape, dtype=dtype, pin_memory=device.type == "cuda")


def pinned_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """:func:`pinned_empty`, zeroed."""
    return torch.zeros(shape, dtype=dtype, pin_memory=device.type == "cuda")


def managed_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised tensor on CUDA ``device`` whose memory is managed memory kept in host DRAM and mapped for the
    device (the module's docstring, "Managed memory"), freed when the last view of it is gone; on another device, or
    where the CUDA runtime refuses managed memory, :func:`pinned_empty`'s memory (its :func:`device_view` on CUDA)."""
    if device.type != "cuda":
        return pinned_empty(shape, dtype, device)
    nbytes = int(torch.Size(shape).numel()) * dtype.itemsize
    pointer = _managed(nbytes, device) if nbytes else None
    if pointer is None:
        return device_view(pinned_empty(shape, dtype, device), device)
    lib = _cudart()
    with torch.cuda.device(device):
        raw = torch.as_tensor(RawMemory(pointer, nbytes, lambda p: lib.cudaFree(ctypes.c_void_p(p))), device=device)
    return raw.view(dtype).view(shape)


def managed_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """:func:`managed_empty`, zeroed (by the device, across the host link)."""
    return managed_empty(shape, dtype, device).zero_()


class RawMemory:
    """Memory the CUDA runtime handed out, as torch builds a CUDA tensor from it (``__cuda_array_interface__``):
    ``free(pointer)`` runs when torch drops this object, with the last storage built from it."""

    def __init__(self, pointer: int, nbytes: int, free: Callable[[int], Any]) -> None:
        self.pointer, self.free = pointer, free
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (pointer, False),
            "version": 3,
            "strides": None,
        }

    def __del__(self) -> None:
        self.free(self.pointer)


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def _managed(nbytes: int, device: torch.device) -> int | None:
    """``nbytes`` of managed memory preferring the CPU and mapped for ``device`` (its pointer), or None where the
    runtime refuses any step (the memory is freed again)."""
    lib = _cudart()
    if lib is None:
        return None
    torch.cuda.init()  # type: ignore[no-untyped-call]
    pointer = ctypes.c_void_p()
    if lib.cudaMallocManaged(ctypes.byref(pointer), ctypes.c_size_t(nbytes), ctypes.c_uint(1)) != 0:  # global
        lib.cudaGetLastError()  # cleared: torch's next launch check would report it as its own
        return None
    assert pointer.value is not None
    index = device.index if device.index is not None else torch.cuda.current_device()
    on_cpu = _advise(lib, pointer.value, nbytes, 3, host=True, index=index)  # preferred location: the CPU
    if on_cpu and _advise(lib, pointer.value, nbytes, 5, host=False, index=index):  # this GPU maps it, no migration
        return int(pointer.value)
    lib.cudaGetLastError()
    lib.cudaFree(pointer)
    return None


def _advise(lib: Any, pointer: int, nbytes: int, advice: int, *, host: bool, index: int) -> bool:
    """``cudaMemAdvise`` for the CPU (``host``) or GPU ``index``, whether it took: CUDA 13 takes a
    ``cudaMemLocation`` (host 2, device 1), CUDA 12 a device ordinal (the CPU -1)."""
    version = ctypes.c_int()
    if lib.cudaRuntimeGetVersion(ctypes.byref(version)) != 0:
        return False
    args: tuple[Any, ...] = (ctypes.c_void_p(pointer), ctypes.c_size_t(nbytes), ctypes.c_int(advice))
    if version.value >= 13000:
        return bool(lib.cudaMemAdvise(*args, _Location(2 if host else 1, 0 if host else index)) == 0)
    return bool(lib.cudaMemAdvise(*args, ctypes.c_int(-1 if host else index)) == 0)


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
    """Whether CUDA tensor ``t`` lies in host memory mapped for the device — a :func:`device_view` of pinned memory or
    :func:`managed_empty`'s managed memory — as the CUDA runtime reports it."""
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
    return bool(attributes.type in (1, 3))  # cudaMemoryTypeHost, cudaMemoryTypeManaged


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
