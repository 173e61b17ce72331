/* Streaming GGUF v3 writer: metadata and tensor infos first, then tensor data written in order
 * straight to disk, so files larger than RAM can be written.
 *
 *   gguf_writer *w; gguf_writer_create(&w, path, st);
 *   gguf_writer_set_u32(w, "qwen35.block_count", 24); ...        (any KV, any order)
 *   gguf_writer_add_tensor(w, "token_embd.weight", 2, ne, type); ... (declares; data later)
 *   gguf_writer_begin_data(w, st);                                  (writes header + infos)
 *   for each tensor in declaration order: gguf_writer_write_data(w, bytes, n, st) (may be
 *       called several times per tensor; the writer pads to the alignment between tensors)
 *   gguf_writer_finish(w, st); gguf_writer_destroy(w);
 *
 * gguf_writer_tensor_offset gives each tensor's final file offset after begin_data, so
 * several threads may pwrite data into their own ranges (gguf_writer_pwrite) instead. */
#ifndef DS_GGUF_GGUF_WRITER_H
#define DS_GGUF_GGUF_WRITER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "gguf/gguf.h"

typedef struct gguf_writer gguf_writer;

/* Setters and add_tensor never take a status: the first error (bad key, bad shape, call after
 * begin_data, no memory) is kept and returned, with its message, by gguf_writer_begin_data.
 * Setting a key twice replaces its value. general.alignment, if set, must be a u32 power of
 * two; without it the default 32 is used and the key is not written. Tensor names must be
 * 1..63 bytes (llama.cpp's limit) and unique. */
int gguf_writer_create(gguf_writer **out, const char *path, status *st);
void gguf_writer_destroy(gguf_writer *w); /* closes the file if still open */

int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
/* Any scalar type (not STRING/ARRAY): value points at one packed value of that type. */
int gguf_writer_set_val(gguf_writer *w, const char *key, gguf_vtype type, const void *value);
/* Arrays of scalars: data holds n packed values of elem_type (copied). */
int gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type, const void *data,
                        uint64_t n);
/* Array of strings (copied). */
int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                            uint64_t n);

/* Declares a tensor; ne in ggml order. Returns the tensor's index. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims,
                           const uint64_t *ne, uint32_t type); /* -1 on error */

int gguf_writer_begin_data(gguf_writer *w, status *st);
uint64_t gguf_writer_tensor_offset(const gguf_writer *w, int index); /* absolute file offset */
uint64_t gguf_writer_tensor_bytes(const gguf_writer *w, int index);
int gguf_writer_write_data(gguf_writer *w, const void *data, uint64_t n, status *st);
/* Thread-safe after begin_data: [file_offset, +n) must lie inside one tensor's data. With
 * pwrite, each tensor byte must be written exactly once (finish checks the total). Do not mix
 * with write_data in one file. */
int gguf_writer_pwrite(gguf_writer *w, const void *data, uint64_t n, uint64_t file_offset,
                       status *st);
/* Checks every tensor byte was written, pads the file to its final size and closes it. */
int gguf_writer_finish(gguf_writer *w, status *st);

#endif
