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


@pytest.mark.skipif(not _C._built_with_cuda(), reason="the NCCL rail is in the CUDA build")
def test_nccl_comm_blocking_1_is_refused_naming_the_variable():
    # NCCL applies NCCL_COMM_BLOCKING over the config's blocking = 0: a
    # blocking communicator would wait without the group's timeout.
    why = _C._nccl_environment_refusal_for_test("1")
    assert "NCCL_COMM_BLOCKING=1" in why and "non-blocking" in why and "Unset NCCL_COMM_BLOCKING" in why, why
    # NCCL reads it with strtoll (base 0), ignoring what follows the number.
    assert _C._nccl_environment_refusal_for_test("0x1") != ""
    assert _C._nccl_environment_refusal_for_test(" 1") != ""
    for fine in (None, "", "0", "2", "abc"):
        assert _C._nccl_environment_refusal_for_test(fine) == "", fine
