/* Stand-in for <stddef.h> when gen_cdefs.py preprocesses qsakv.h: pycparser needs plain
 * C, and the generator maps these typedef names to ctypes by name, not by definition. */
#ifndef FAKE_LIBC_STDDEF_H
#define FAKE_LIBC_STDDEF_H
typedef unsigned long size_t;
typedef long ptrdiff_t;
#define NULL ((void*)0)
#endif
