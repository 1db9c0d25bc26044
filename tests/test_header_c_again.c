// SPDX-License-Identifier: Apache-2.0
/* A second C translation unit including the header (twice): no duplicate definitions. */
#include "qsakv.h"
#include "qsakv.h"

int qsakv_header_again_version(void) { return qsakv_version(); }
size_t qsakv_header_again_stream_size(void) { return sizeof(qsakv_stream_t); }
