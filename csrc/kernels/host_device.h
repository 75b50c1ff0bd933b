// FAIRRING_HOST_DEVICE: a function compiled for the host and, under nvcc,
// for the device too (headers shared by the CPU and CUDA kernels).
#pragma once

#if defined(__CUDACC__)
#define FAIRRING_HOST_DEVICE __host__ __device__
#else
#define FAIRRING_HOST_DEVICE
#endif
