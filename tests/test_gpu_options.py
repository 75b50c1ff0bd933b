"""GPU-related options and build flags that can be checked without a GPU."""
import pytest

from fairring_py import _C
from fairring_py.options import Options, resolve


def test_gpu_transport_default_and_tcp():
    assert resolve(environ={}).gpu_transport == "tcp"
    assert resolve(environ={"FAIRRING_GPU_TRANSPORT": "TCP"}).gpu_transport == "tcp"
    assert resolve(Options(gpu_transport="tcp"), environ={}).gpu_transport == "tcp"


@pytest.mark.skipif(_C._built_with_cuda(), reason="checks the CPU-only build")
def test_gpu_transport_nccl_needs_a_cuda_build():
    with pytest.raises(ValueError, match="FAIRRING_GPU_TRANSPORT=nccl needs fairring_py._C built with CUDA"):
        resolve(environ={"FAIRRING_GPU_TRANSPORT": "nccl"})
    with pytest.raises(ValueError, match="Options.gpu_transport=nccl needs"):
        resolve(Options(gpu_transport="nccl"), environ={})


@pytest.mark.skipif(not _C._built_with_cuda(), reason="checks the CUDA build")
def test_gpu_transport_nccl_accepted_by_a_cuda_build():
    assert resolve(environ={"FAIRRING_GPU_TRANSPORT": "NCCL"}).gpu_transport == "nccl"


def test_gpu_transport_unknown_names_the_variable():
    with pytest.raises(ValueError, match="FAIRRING_GPU_TRANSPORT must be one of tcp, nccl"):
        resolve(environ={"FAIRRING_GPU_TRANSPORT": "rdma"})


def test_build_flag_is_a_bool():
    assert _C._built_with_cuda() in (True, False)
