// SPDX-License-Identifier: Apache-2.0
// NVRTC has no C library: the fixed-width types the kernels use (LP64), for the sm_70
// build check only (tools/sm70/sm70_check.py).
#pragma once
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
typedef unsigned long uintptr_t;
typedef long intptr_t;
