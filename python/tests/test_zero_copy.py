"""Inputs reach C++ without a copy: the data pointer is unchanged and memory does not grow by
the input size."""
import tracemalloc

import numpy as np
import torch

import attn
from attn import _attn


def test_data_pointer_reaches_cpp_unchanged():
    t = torch.randn(1, 64, 4, 32).transpose(1, 2)  # non-contiguous view
    assert _attn.data_pointer(t) == t.data_ptr()
    a = np.random.standard_normal((1, 64, 4, 32)).astype(np.float32)[:, ::2]  # strided slice
    assert _attn.data_pointer(a) == a.ctypes.data
    m = np.broadcast_to(np.ones((64, 64), bool), (2, 4, 64, 64))  # read-only, stride-0 view
    assert _attn.data_pointer(m) == m.ctypes.data
    bf = torch.randn(1, 8, 2, 16).to(torch.bfloat16)
    assert _attn.data_pointer(bf) == bf.data_ptr()


def test_memory_does_not_grow_by_the_input_size():
    n = 4096
    q = np.random.standard_normal((1, n, 8, 64)).astype(np.float32)  # 8 MiB each
    k = np.random.standard_normal((1, n, 8, 64)).astype(np.float32)[:, :, ::2]  # strided view
    v = k
    tracemalloc.start()
    out = attn.attention(q, k, v)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert out.shape == q.shape
    # the only new allocation tracked by numpy is the output (8 MiB); a copy of q (8 MiB) or
    # of k and v would push the peak beyond 1.5x the output
    assert peak < 1.5 * out.nbytes, peak
