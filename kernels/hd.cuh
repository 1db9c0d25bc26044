// SPDX-License-Identifier: Apache-2.0
// Host/device qualifiers so the numerics headers compile with nvcc and with g++.
#pragma once

#if defined(__CUDACC__)
#define QSAKV_HD __host__ __device__ __forceinline__
#else
#define QSAKV_HD inline
#endif
