// SPDX-License-Identifier: Apache-2.0
// NVRTC has no C library: size_t for qsakv.h, for the sm_70 build check only.
#pragma once
typedef unsigned long size_t;
typedef long ptrdiff_t;
#ifndef NULL
#define NULL 0
#endif
