"""CPU kernels: autograd Functions and in-place loops that compute what a plain reference form
defines, faster on a CPU. Each kernel's docstring names its reference; ``tests/kernels/``
compares the two (value, gradient, the no-grad path, float64).

| kernel | reference |
|---|---|
| :func:`cp_product` (blocked, :func:`cp_block_rows`) | :func:`arbench.naive.naive_cp_product` |
| :func:`projected_power` | :func:`arbench.naive.naive_projected_power` |
| :func:`taylor_features` | :func:`arbench.naive.naive_taylor_features` |
| :func:`chunked_attention` | :func:`arbench.attention.chunked_plain` |
| :func:`causal_conv` | :func:`arbench.naive.naive_causal_conv` |
| :func:`rms_norm_low` (bf16 and fp16 only) | ``nn.RMSNorm`` on the input in fp32 |
| :func:`keep_heap` (malloc setting) | glibc's defaults (``ARBENCH_MALLOC=system``) |

Inside two of them, :mod:`arbench.kernels.fused` runs an elementwise chain as one compiled pass
(``torch.compile``, inductor's C++ backend): the CP product and its gradient per block (every
dtype; bit-identical to the eager chain in fp32) and, in bf16 and fp16 only, the short
convolution and its gradient; :func:`rms_norm_low` (the attention output's RMSNorm, bf16 and
fp16 only) is such a chain forward and backward. :func:`arbench.kernels.fused.fused_kernels`
switches them off (the eager chains run, as they do without a working C++ compiler).

CUDA paths, where :func:`arbench.precision.use_cuda_kernels` holds (the same rule on a CUDA
tensor):

- :func:`arbench.kernels.compiled.compiled_cp_product` (``torch.compile``) equals
  :func:`arbench.naive.naive_cp_product`;
- :mod:`arbench.kernels.fla_backend` (fla's Triton kernels, bf16/fp16, an optional install)
  computes the chunked forms of :func:`arbench.attention.linear_attention` and
  :func:`arbench.delta.delta_attention`.

Where they run is decided by one rule, :func:`arbench.precision.use_cpu_kernels` (a CPU
tensor, not being compiled, not switched off by :func:`arbench.precision.cpu_kernels`); the
callers in featuremaps, attention and mixers take the reference form elsewhere.
"""

from arbench.kernels.allocator import keep_heap
from arbench.kernels.chunked import chunked_attention
from arbench.kernels.conv import causal_conv
from arbench.kernels.cp import block_rows, cp_block_rows, cp_product, projected_power
from arbench.kernels.norm import rms_norm_low
from arbench.kernels.taylor import taylor_features

__all__ = ["block_rows", "causal_conv", "chunked_attention", "cp_block_rows", "cp_product",
           "keep_heap", "projected_power", "rms_norm_low", "taylor_features"]
