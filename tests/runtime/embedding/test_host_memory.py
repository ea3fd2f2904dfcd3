"""Host memory for ``host`` groups: managed memory kept in host DRAM and mapped for the GPU (CUDA), and the plain
host tensor elsewhere."""

from __future__ import annotations

import pytest
import torch

from shardwise.runtime.embedding.host_memory import is_mapped, managed_empty, managed_zeros

MIB = 1 << 20


def test_without_cuda_the_memory_is_a_host_tensor() -> None:
    t = managed_zeros((3, 5), torch.float16, torch.device("cpu"))
    assert t.device.type == "cpu"
    assert t.dtype == torch.float16
    assert t.shape == (3, 5)
    assert not bool(t.any())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_managed_rows_stay_in_host_dram_and_kernels_read_and_write_them() -> None:
    device = torch.device("cuda", 0)
    torch.cuda.synchronize(device)
    allocated = torch.cuda.memory_allocated(device)
    free_before, _ = torch.cuda.mem_get_info(device)
    rows = managed_empty((256 * MIB // 512, 128), torch.float32, device)  # 256 MiB
    assert rows.device == device
    assert is_mapped(rows)
    rows.copy_(torch.arange(rows.shape[0], device=device, dtype=torch.float32)[:, None].expand_as(rows))
    rows[7] += 1.0  # a kernel reads and writes them in place
    sums = rows.sum(dim=1)
    torch.cuda.synchronize(device)
    assert sums[7].item() == 8.0 * 128
    assert sums[-1].item() == (rows.shape[0] - 1) * 128.0
    assert torch.equal(rows[:9].cpu()[:, 0], torch.tensor([0, 1, 2, 3, 4, 5, 6, 8, 8], dtype=torch.float32))
    # torch's allocator holds none of it, and the driver did not move the pages into the device
    assert torch.cuda.memory_allocated(device) - allocated < 8 * MIB
    free_after, _ = torch.cuda.mem_get_info(device)
    assert free_before - free_after < 128 * MIB, (free_before - free_after) / MIB
