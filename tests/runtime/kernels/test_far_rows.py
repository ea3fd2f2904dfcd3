"""``far_rows``: the offset that lets one pooled launch read a second tensor's rows after the first's."""

from __future__ import annotations

import pytest
import torch

fk = pytest.importorskip("shardwise.runtime.kernels.fused_update", reason="the kernels need Triton")


def test_the_offset_reaches_the_second_tensor_row_for_row() -> None:
    near, far = torch.zeros(10, 4), torch.zeros(6, 4)
    delta = fk.far_rows(near, 10, far)
    # row r >= split of the pair is at near's pointer + r * stride + delta elements: row r - split of far
    for r in (10, 13, 15):
        assert near.data_ptr() + (r * near.stride(0) + delta) * 4 == far[r - 10].data_ptr()


@pytest.mark.parametrize(
    ("far", "message"),
    [
        (torch.zeros(6, 4, dtype=torch.float16), "must be torch.float32 with 4 columns"),
        (torch.zeros(6, 5), "must be torch.float32 with 4 columns"),
        (torch.zeros(6, 8)[:, :4], "row stride"),
        (torch.zeros(4, 6).t(), "row stride"),
    ],
)
def test_rows_that_do_not_line_up_are_refused(far: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fk.far_rows(torch.zeros(10, 4), 10, far)


def test_a_negative_split_is_refused() -> None:
    with pytest.raises(ValueError, match="split=-1"):
        fk.far_rows(torch.zeros(10, 4), -1, torch.zeros(2, 4))
