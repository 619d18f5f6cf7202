"""The blocked CP product and power map against their references in arbench.naive:
value, gradient (float64 gradcheck), the no-grad path, float64 in and out, block sizes."""

import pytest
import torch

from arbench import kernels
from arbench.featuremaps import cp_weights
from arbench.kernels.cp import (
    DEFAULT_BLOCK_ROWS,
    DEFAULT_LOW_PRECISION_BLOCK_ROWS,
    block_rows,
    cp_block_rows,
)
from arbench.naive import int_power, naive_cp_product, naive_projected_power


def definition(x, theta, bias=None):
    """Σ_r Π_j (x Θ_{j,r} + c_{j,r}), one factor at a time."""
    rank, p = theta.shape[:2]
    return sum(torch.prod(torch.stack([x @ theta[r, j] + (0 if bias is None else bias[r, j])
                                       for j in range(p)]), dim=0) for r in range(rank))


@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("p,rank,rows", [(2, 2, 4), (3, 1, 5), (5, 2, 24), (2, 3, 1), (4, 2, 0)])
def test_cp_product_kernel_equals_the_reference(p, rank, rows, affine):
    # 2·3·3 = 18 rows in blocks of `rows`: several blocks, a short last one, or one block (0)
    torch.manual_seed(p)
    x = torch.randn(2, 3, 4, 4, dtype=torch.double, requires_grad=True)[:, :, 1:]  # strided
    theta = torch.randn(rank, p, 4, 3, dtype=torch.double, requires_grad=True)
    bias = torch.randn(rank, p, 3, dtype=torch.double, requires_grad=True) if affine else None
    w, b = cp_weights(theta, bias)
    want = naive_cp_product(x, w, p, rank, b)
    torch.testing.assert_close(want, definition(x, theta, bias))  # the reference is the sum
    got = kernels.cp_product(x, w, p, rank, b, rows=rows)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want)
    with torch.no_grad():  # the inference path (one reused block buffer)
        torch.testing.assert_close(kernels.cp_product(x, w, p, rank, b, rows=rows), want)
    leaves = [t for t in (x, theta, bias) if t is not None]
    dy = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, leaves, dy),
                               torch.autograd.grad(want, leaves, dy))
    (gx,) = torch.autograd.grad(kernels.cp_product(x, w.detach(), p, rank, rows=rows).sum(), x)
    (gx_want,) = torch.autograd.grad(naive_cp_product(x, w.detach(), p, rank).sum(), x)
    torch.testing.assert_close(gx, gx_want)  # a gradient for the input alone

    def through_kernel(x, theta, *bias):
        w, b = cp_weights(theta, bias[0] if bias else None)
        return kernels.cp_product(x, w, p, rank, b, rows=rows)

    assert torch.autograd.gradcheck(through_kernel, tuple(leaves))


@pytest.mark.parametrize("p,rows", [(1, 4), (2, 5), (3, 24), (4, 4), (6, 7), (7, 1)])
def test_projected_power_kernel_equals_the_reference(p, rows):
    torch.manual_seed(p)
    x = torch.randn(2, 3, 3, 5, dtype=torch.double, requires_grad=True)[..., 1:]  # strided
    w = torch.randn(4, 3, dtype=torch.double, requires_grad=True)
    want = naive_projected_power(x, w, p)
    torch.testing.assert_close(want, (x @ w).pow(p))
    torch.testing.assert_close(int_power(x @ w, p), (x @ w).pow(p))
    got = kernels.projected_power(x, w, p, rows=rows)
    torch.testing.assert_close(got, want)
    with torch.no_grad():
        torch.testing.assert_close(kernels.projected_power(x, w, p, rows=rows), want)
    dy = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, (x, w), dy),
                               torch.autograd.grad(want, (x, w), dy))
    assert torch.autograd.gradcheck(lambda a, b: kernels.projected_power(a, b, p, rows=rows),
                                     (x, w))


def test_float32_kernels_match_the_reference_to_rounding():
    torch.manual_seed(0)
    x, theta = torch.randn(3, 70, 16), torch.randn(2, 4, 16, 8) * 0.3
    w, _ = cp_weights(theta)
    torch.testing.assert_close(kernels.cp_product(x, w, 4, 2, rows=32), naive_cp_product(x, w, 4, 2))
    torch.testing.assert_close(kernels.projected_power(x, w[:, :8], 4, rows=32),
                               naive_projected_power(x, w[:, :8], 4))


def test_block_rows_is_a_context_value():
    assert block_rows() == DEFAULT_BLOCK_ROWS
    with cp_block_rows(7):
        assert block_rows() == 7
        with cp_block_rows(0):
            assert block_rows() == 0
        assert block_rows() == 7
    assert block_rows() == DEFAULT_BLOCK_ROWS
    assert block_rows(torch.bfloat16) == block_rows(torch.float16) == \
        DEFAULT_LOW_PRECISION_BLOCK_ROWS
    assert block_rows(torch.float64) == DEFAULT_BLOCK_ROWS
    with cp_block_rows(7):  # one value for every dtype
        assert block_rows(torch.bfloat16) == 7
    with cp_block_rows(7, low_precision=64):
        assert (block_rows(), block_rows(torch.bfloat16)) == (7, 64)
    assert block_rows(torch.bfloat16) == DEFAULT_LOW_PRECISION_BLOCK_ROWS
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="cp block rows must be an integer >= 0"):
            with cp_block_rows(bad):
                pass
    assert block_rows() == DEFAULT_BLOCK_ROWS
