/* A deterministic byte-level BPE vocabulary for synthetic qwen35 files (docs/QWEN35.md §1.6).
 *
 * Layout of the n_vocab ids:
 *   [0, 256)                   the 256 byte tokens, GPT-2 byte-to-unicode characters, in
 *                              GPT-2's order (printable bytes first)
 *   [256, first_special)       merged tokens, one per merge, in merge (rank) order
 *   [first_special, +n_special) Qwen's special tokens, type CONTROL (<|endoftext|> first)
 *   [.., n_vocab)              [PADn] fillers, type UNUSED
 * For the real vocabulary size (248320) the special tokens get Qwen's own ids
 * (<|endoftext|> 248044, <|im_end|> 248046, <think> 248068) and ids from 248077 are [PADn],
 * like the released files; smaller vocabularies put the special tokens last.
 *
 * Merges are "left right" strings of mapped characters. Every merge's result is the token
 * with the next id, and both of its parts have smaller ids. The merge list is built from
 * common English words and then from letter strings ordered by English letter frequency. */
#ifndef DS_GGUF_SYNTH_VOCAB_H
#define DS_GGUF_SYNTH_VOCAB_H

#include <stdint.h>

#include "common/status.h"

#define SYNTH_TOKEN_NORMAL 1
#define SYNTH_TOKEN_CONTROL 3
#define SYNTH_TOKEN_UNUSED 5

typedef struct synth_vocab {
    uint32_t n_tokens;
    const char **tokens; /* owned, [n_tokens], NUL-terminated UTF-8, pointing into arena */
    int32_t *types;      /* owned, [n_tokens], SYNTH_TOKEN_* */
    uint32_t n_merges;
    const char **merges; /* owned, [n_merges], "left right", pointing into arena */
    uint32_t first_special, n_special;
    uint32_t endoftext_id, im_start_id, im_end_id, think_id, think_end_id;
    char *arena; /* owned, every string above */
} synth_vocab;

/* Smallest vocabulary synth_vocab_build accepts. */
#define SYNTH_VOCAB_MIN 300

/* Builds the vocabulary of n_vocab tokens into *v (which it owns until synth_vocab_free). */
int synth_vocab_build(synth_vocab *v, uint32_t n_vocab, status *st);
void synth_vocab_free(synth_vocab *v);

/* The chat templates gguf synth can write as tokenizer.chat_template. */
typedef enum {
    SYNTH_TEMPLATE_QWEN35 = 0, /* Qwen3.5's as published (synth_qwen35_chat_template.jinja) */
    SYNTH_TEMPLATE_CHATML = 1, /* a short ChatML: the turns, the generation prompt, no thinking */
} synth_template;

/* The template's text, NUL-terminated. */
const char *synth_vocab_chat_template(synth_template t);

/* "qwen35" / "chatml" -> the template, -1 for anything else. */
int synth_template_parse(const char *name);

#endif
