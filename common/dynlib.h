/* A shared library opened at run time and its symbols resolved (the GPU libraries that must
 * not be needed to start: cuBLAS, kernels/cuda/blas.c; NCCL, kernels/cuda/tp_comm.c). */
#ifndef DS_COMMON_DYNLIB_H
#define DS_COMMON_DYNLIB_H

#include <stddef.h>

typedef struct dynlib_sym {
    const char *name;
    void **fn; /* where its address goes (a function pointer cast to void **) */
} dynlib_sym;

/* dlopen(name) and every symbol of syms[0 .. n) into *syms[i].fn. NULL, with `what` saying why
 * in one sentence, when the library is not found ("NAME not found (...); put its folder in
 * LD_LIBRARY_PATH") or lacks a symbol ("NAME lacks SYMBOL"); the library is closed and every
 * *fn is NULL then. */
void *dynlib_open(const char *name, const dynlib_sym *syms, int n, char *what, size_t what_size);
void dynlib_close(void *lib); /* NULL: nothing */

#endif
