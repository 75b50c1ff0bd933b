# A CUDA PyTorch image that builds Fairring and runs its tests.
#
#   docker build -t fairring .
#   docker run --rm --gpus all --shm-size=1g fairring                       # the tests
#   docker run --rm --gpus all --shm-size=1g fairring python -m fairring_py.bench
#
# The tests and the benchmark run many ranks in one container and share memory
# through /dev/shm, whose Docker default (64 MB) is too small: keep --shm-size
# (or use --ipc=host).  The base must be a *devel* tag (it has nvcc, which the
# CUDA sources need) with torch >= 2.11 (setup.py's requirement); another one can
# be chosen with --build-arg BASE_IMAGE=...
ARG BASE_IMAGE=pytorch/pytorch:2.11.0-cuda13.0-cudnn9-devel
FROM ${BASE_IMAGE}

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MAX_JOBS=4 \
    TORCH_CUDA_ARCH_LIST="8.0;9.0;10.0;12.0+PTX"

WORKDIR /workspace/fairring
RUN python -m pip install pybind11 ninja pytest pytest-xdist expecttest numpy

COPY . .
# Drop build outputs that may have come from the host checkout, then build
# in place (CUDA sources are compiled when torch has CUDA and nvcc is found).
RUN rm -rf build *.egg-info fairring_py/_C*.so \
 && python -m pip install --no-build-isolation -e . \
 && python -c "import torch, fairring_py; print('fairring', fairring_py.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda)"

CMD ["python", "-m", "pytest", "-q", "-n", "2", "tests"]
