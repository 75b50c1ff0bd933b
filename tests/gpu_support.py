"""When the GPU tests can run: a CUDA device is visible and fairring_py._C
was built with its CUDA parts.  Everything here imports on a CPU-only machine."""
import pytest
import torch

from fairring_py import _C

BUILT_WITH_CUDA = bool(_C._built_with_cuda())
HAVE_GPU = torch.cuda.is_available()

requires_gpu = pytest.mark.skipif(
    not (HAVE_GPU and BUILT_WITH_CUDA),
    reason="needs a CUDA device and fairring_py._C built with CUDA "
    f"(cuda available: {HAVE_GPU}, built with CUDA: {BUILT_WITH_CUDA})",
)
