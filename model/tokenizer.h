/* Byte-level BPE tokenizer of Qwen3.5 (GGUF tokenizer.ggml.model "gpt2", pre "qwen35").
 *
 * Encode, as the Hugging Face tokenizer does:
 *   1. special tokens (token_type CONTROL 3 and USER_DEFINED 4) are matched in the raw text,
 *      leftmost-longest, and map straight to their id; no BOS is ever added;
 *   2. each piece of text between them is NFC-normalised (utf8proc);
 *   3. split by the qwen35 pre-tokenizer regex (PCRE2, UTF + UCP, JIT);
 *   4. each split is BPE-merged by merge rank over its bytes (the GPT-2 byte->unicode mapping
 *      is a bijection, so merges run on byte-token ids and never on mapped strings).
 * Decode: every token's bytes (reverse byte mapping; a token with a character outside the
 * mapping, e.g. a special token, decodes to its own text), concatenated, then invalid UTF-8
 * replaced by U+FFFD per maximal subpart (what HF's String::from_utf8_lossy does).
 *
 * A tokenizer is immutable after creation: encode/decode may run from any number of threads
 * at once. Input text must be valid UTF-8 (STATUS_INVALID naming the byte offset otherwise). */
#ifndef DS_MODEL_TOKENIZER_H
#define DS_MODEL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "gguf/gguf.h"

/* GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
enum {
    TOKENIZER_TYPE_UNDEFINED = 0,
    TOKENIZER_TYPE_NORMAL = 1,
    TOKENIZER_TYPE_UNKNOWN = 2,
    TOKENIZER_TYPE_CONTROL = 3,
    TOKENIZER_TYPE_USER_DEFINED = 4,
    TOKENIZER_TYPE_UNUSED = 5,
    TOKENIZER_TYPE_BYTE = 6,
};

/* Pre-tokenizer split regex (GGUF tokenizer.ggml.pre). */
typedef enum tokenizer_pre {
    TOKENIZER_PRE_QWEN35 = 0, /* docs/QWEN35.md §1.6 */
    TOKENIZER_PRE_QWEN2 = 1,  /* the same without \p{M} */
} tokenizer_pre;

/* A byte string that need not be NUL-terminated. */
typedef struct tokenizer_text {
    const char *ptr;
    size_t len;
} tokenizer_text;

/* Plain-array description of a vocabulary, as stored in GGUF. Everything is copied by
 * tokenizer_create; the arrays need not outlive the call. */
typedef struct tokenizer_spec {
    size_t n_tokens;
    const tokenizer_text *tokens; /* [n_tokens] byte-mapped text ("Ġthe"), specials verbatim */
    const int32_t *token_types;   /* [n_tokens] TOKENIZER_TYPE_*, or NULL: all NORMAL */
    size_t n_merges;
    const tokenizer_text *merges; /* [n_merges] "left right", rank = index */
    int32_t eos_id;               /* tokenizer.ggml.eos_token_id, -1 if absent */
    int32_t bos_id;               /* tokenizer.ggml.bos_token_id, -1 if absent (never added) */
    tokenizer_pre pre;            /* split regex */
    tokenizer_text chat_template; /* tokenizer.chat_template (Jinja text), ptr NULL if absent */
} tokenizer_spec;

typedef struct tokenizer tokenizer;

/* Builds a tokenizer from plain arrays. STATUS_FORMAT on an inconsistent vocabulary (a merge
 * without a space, eos out of range), STATUS_NOMEM. */
int tokenizer_create(tokenizer **out, const tokenizer_spec *spec, status *st);
/* Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,eos_token_id,bos_token_id} and
 * tokenizer.chat_template (optional) from f and calls tokenizer_create. f may be closed afterwards. STATUS_UNSUPPORTED for a model other
 * than "gpt2" or a pre-tokenizer other than "qwen35" (the default when absent) or "qwen2" (the
 * same regex without \p{M}); STATUS_NOT_FOUND when tokens or merges are missing. */
int tokenizer_load(tokenizer **out, const gguf_file *f, status *st);
/* Opens the GGUF at path, loads its tokenizer, closes the file. */
int tokenizer_load_path(tokenizer **out, const char *path, status *st);
void tokenizer_destroy(tokenizer *t);

size_t tokenizer_n_vocab(const tokenizer *t);
/* The GGUF text of id (byte-mapped for normal tokens); NULL if id is out of range. */
const char *tokenizer_token_text(const tokenizer *t, int32_t id, size_t *len);
/* The raw bytes id decodes to (may be an incomplete UTF-8 sequence); NULL if out of range. */
const uint8_t *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *len);
int32_t tokenizer_token_type(const tokenizer *t, int32_t id); /* -1 if out of range */
/* Id of the token whose GGUF text is exactly `text` (NUL-terminated), or -1. */
int32_t tokenizer_find_token(const tokenizer *t, const char *text);

/* The model's chat template (GGUF tokenizer.chat_template, Jinja source for
 * model/chat_template.h), NUL-terminated; NULL when the GGUF has none. */
const char *tokenizer_chat_template(const tokenizer *t, size_t *len);

/* Special ids, -1 when the vocabulary has none. */
int32_t tokenizer_eos_id(const tokenizer *t);        /* tokenizer.ggml.eos_token_id */
int32_t tokenizer_bos_id(const tokenizer *t);        /* informational: never added */
int32_t tokenizer_im_start_id(const tokenizer *t);   /* "<|im_start|>" */
int32_t tokenizer_im_end_id(const tokenizer *t);     /* "<|im_end|>" */
int32_t tokenizer_endoftext_id(const tokenizer *t);  /* "<|endoftext|>" */
/* End of generation: eos, <|im_end|> or <|endoftext|>. */
bool tokenizer_is_eog(const tokenizer *t, int32_t id);
/* The end-of-generation ids (distinct, at most 3); returns how many were written. */
size_t tokenizer_eog_ids(const tokenizer *t, int32_t out[3]);

/* Encodes text[0..len) (len bytes; NULs allowed). On success *ids is malloc'd (caller frees;
 * may be NULL when *n_ids == 0). STATUS_INVALID for invalid UTF-8, STATUS_NOMEM. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids,
                     size_t *n_ids, status *st);

/* Decodes ids to text (invalid UTF-8 replaced by U+FFFD). *text is malloc'd and
 * NUL-terminated, *len excludes the NUL. STATUS_RANGE naming the index of an unknown id. */
int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n_ids, char **text,
                     size_t *len, status *st);

/* Streaming detokenizer: push ids one at a time, get back only complete UTF-8 (an incomplete
 * tail is held back until the next id completes it; bytes that can never become valid are
 * replaced by U+FFFD at once). The concatenation of every push and the final flush equals
 * tokenizer_decode of the whole sequence, byte for byte. No allocation: the state is this
 * struct, the output goes into a caller buffer of at least tokenizer_detok_max_out(t) bytes. */
typedef struct tokenizer_detok {
    const tokenizer *t; /* borrowed */
    uint8_t pend[4];    /* the held-back incomplete sequence, a valid prefix */
    uint8_t n_pend;     /* bytes in pend (0..3) */
    uint8_t need;       /* total length of the pending sequence (2..4), 0 when none */
    uint8_t lo, hi;     /* allowed range of the next continuation byte */
} tokenizer_detok;

void tokenizer_detok_init(tokenizer_detok *d, const tokenizer *t);
/* Bytes a push or flush may write at most: 3 * (longest token + 3). */
size_t tokenizer_detok_max_out(const tokenizer *t);
/* Appends the text that id completes to out[0..*n_out) (cap >= tokenizer_detok_max_out(t),
 * asserted). STATUS_RANGE for an unknown id (the state is unchanged). No NUL is written. */
int tokenizer_detok_push(tokenizer_detok *d, int32_t id, char *out, size_t cap, size_t *n_out,
                         status *st);
/* Ends the stream: an incomplete tail becomes one U+FFFD. Writes at most 3 bytes; the state
 * is reset so the struct can be reused. Returns the number of bytes written. */
size_t tokenizer_detok_flush(tokenizer_detok *d, char *out, size_t cap);

#endif
