/* Private to model/tokenizer*.c: the tokenizer's tables and the helpers shared by the files. */
#ifndef DS_MODEL_TOKENIZER_INTERNAL_H
#define DS_MODEL_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "model/tokenizer.h"

/* One BPE merge: left id, right id -> (rank, merged id). */
typedef struct tokenizer_pair {
    uint64_t key;  /* (uint64)left << 32 | right; TOKENIZER_PAIR_EMPTY when the slot is free */
    int32_t rank;
    int32_t id;
} tokenizer_pair;

#define TOKENIZER_PAIR_EMPTY UINT64_MAX

struct tokenizer {
    size_t n_vocab;
    int32_t *types;       /* owned, [n_vocab] TOKENIZER_TYPE_* */
    char *text;           /* owned, every GGUF token text, each NUL-terminated */
    size_t *text_off;     /* owned, [n_vocab] offset into text */
    uint32_t *text_len;   /* owned, [n_vocab] */
    uint8_t *bytes;       /* owned, every token's decoded bytes */
    size_t *bytes_off;    /* owned, [n_vocab] offset into bytes */
    uint32_t *bytes_len;  /* owned, [n_vocab] */
    size_t max_token_bytes;

    struct tokenizer_slot {
        uint32_t hash;    /* high half of the text's hash: most misses end here */
        int32_t id;       /* token id, -1 when the slot is free */
    } *text_map;          /* owned, [text_map_mask + 1] open addressing */
    size_t text_map_mask;
    tokenizer_pair *pairs; /* owned, [pair_mask + 1] open addressing */
    size_t pair_mask;
    size_t n_merges;      /* merges kept (both sides and the result in the vocabulary) */

    int32_t byte_id[256]; /* id of the one-byte token of each byte value */

    /* Special tokens (CONTROL, USER_DEFINED) grouped by first byte, longest first. */
    int32_t *special_ids; /* owned, [n_special] */
    size_t n_special;
    uint32_t special_start[257]; /* special_ids[special_start[b] .. special_start[b+1]) */

    pcre2_code *re;       /* owned, split regex (JIT compiled when available) */
    bool re_jit;

    int32_t eos, bos, im_start, im_end, endoftext;
    char *chat_template;  /* owned, NUL-terminated tokenizer.chat_template, or NULL */
    size_t chat_template_len;
};

/* FNV-1a over bytes: the text map's hash. */
uint64_t tokenizer_hash_bytes(const void *p, size_t n);
static inline uint64_t tokenizer_hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Merge lookup: fills *rank and *id and returns true when (left, right) is a merge. Inline:
 * it is the BPE inner loop. */
static inline bool tokenizer_pair_find(const tokenizer *t, int32_t left, int32_t right,
                                       int32_t *rank, int32_t *id)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t i = tokenizer_hash_u64(key) & t->pair_mask;
    for (;; i = (i + 1) & t->pair_mask) {
        const tokenizer_pair *p = &t->pairs[i];
        if (p->key == key) {
            *rank = p->rank;
            *id = p->id;
            return true;
        }
        if (p->key == TOKENIZER_PAIR_EMPTY) return false;
    }
}
/* Text map lookup over (p, n); -1 if absent. */
int32_t tokenizer_text_find(const tokenizer *t, const char *p, size_t n);

/* Compiles the split regex for pre into t->re. */
int tokenizer_regex_compile(tokenizer *t, tokenizer_pre pre, status *st);

/* UTF-8 checks shared by encode and decode. Returns the byte offset of the first invalid
 * sequence, or n when p[0..n) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
size_t tokenizer_utf8_check(const uint8_t *p, size_t n);

#endif
