/* model/sampler penalties: every accepted token in order, and the multiset of the counted ones
 * inside the window (a dense list indexed through an open-addressing hash map), so step 1
 * costs O(distinct tokens in the window), not O(V). */
#include "model/sampler_internal.h"

static inline uint32_t sampler_hash(const sampler *s, int32_t tok) {
    return ((uint32_t)tok * 2654435761u) >> s->map_shift;
}

/* Slot holding tok, or the empty slot where it would go. */
static uint32_t sampler_map_slot(const sampler *s, int32_t tok) {
    uint32_t i = sampler_hash(s, tok);
    while (s->map_key[i] != -1 && s->map_key[i] != tok) i = (i + 1) & s->map_mask;
    return i;
}

void sampler_penalty_reset(sampler *s) {
    /* find every occupied slot first (clearing one breaks the probe chains of others) */
    for (int32_t k = 0; k < s->n_distinct; k++) s->d_cnt[k] = (int32_t)sampler_map_slot(s, s->d_tok[k]);
    for (int32_t k = 0; k < s->n_distinct; k++) s->map_key[s->d_cnt[k]] = -1;
    s->n_distinct = 0;
    s->n_seq = 0;
}

static void sampler_count_add(sampler *s, int32_t tok) {
    uint32_t i = sampler_map_slot(s, tok);
    if (s->map_key[i] == tok) {
        s->d_cnt[s->map_idx[i]]++;
        return;
    }
    DS_ASSERT(s->n_distinct < s->n_dense_max);
    s->map_key[i] = tok;
    s->map_idx[i] = s->n_distinct;
    s->d_tok[s->n_distinct] = tok;
    s->d_cnt[s->n_distinct] = 1;
    s->n_distinct++;
}

/* Linear-probing deletion with backward shift: later entries of the probe run whose home
 * slot is not cyclically in (i, j] move back into the hole. */
static void sampler_map_delete(sampler *s, uint32_t i) {
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & s->map_mask;
        if (s->map_key[j] == -1) break;
        uint32_t h = sampler_hash(s, s->map_key[j]);
        bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (!stays) {
            s->map_key[i] = s->map_key[j];
            s->map_idx[i] = s->map_idx[j];
            i = j;
        }
    }
    s->map_key[i] = -1;
}

static void sampler_count_remove(sampler *s, int32_t tok) {
    uint32_t i = sampler_map_slot(s, tok);
    DS_ASSERT(s->map_key[i] == tok);
    int32_t k = s->map_idx[i];
    if (--s->d_cnt[k] > 0) return;
    sampler_map_delete(s, i);
    int32_t last = --s->n_distinct;
    if (k != last) { /* move the last dense entry into the hole */
        s->d_tok[k] = s->d_tok[last];
        s->d_cnt[k] = s->d_cnt[last];
        s->map_idx[sampler_map_slot(s, s->d_tok[k])] = k;
    }
}

static void sampler_push(sampler *s, int32_t tok, bool counted) {
    DS_ASSERT(tok >= 0 && tok < s->n_vocab);
    DS_ASSERT(s->n_seq < s->n_ctx_max);
    s->seq[s->n_seq] = tok;
    s->seq_counted[s->n_seq] = counted;
    s->n_seq++;
    if (counted) sampler_count_add(s, tok);
    int64_t w = s->p.penalty_window;
    if (w > 0 && s->n_seq > w) { /* position n_seq - 1 - w leaves the window */
        int64_t old = s->n_seq - 1 - w;
        if (s->seq_counted[old]) sampler_count_remove(s, s->seq[old]);
    }
}

void sampler_accept_prompt(sampler *s, const int32_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++) sampler_push(s, ids[i], s->p.penalize_prompt);
}

void sampler_accept(sampler *s, int32_t token) { sampler_push(s, token, true); }

int64_t sampler_n_accepted(const sampler *s) { return s->n_seq; }

/* sampler_push undone, last token first: its count goes, and the token that left the window
 * when it came comes back. */
void sampler_rollback(sampler *s, int64_t n_accepted, uint64_t step) {
    DS_ASSERT(n_accepted >= 0 && n_accepted <= s->n_seq && step <= s->step);
    const int64_t w = s->p.penalty_window;
    while (s->n_seq > n_accepted) {
        const int64_t t = --s->n_seq;
        if (s->seq_counted[t]) sampler_count_remove(s, s->seq[t]); /* the newest is in the window */
        if (w > 0 && t >= w && s->seq_counted[t - w]) sampler_count_add(s, s->seq[t - w]);
    }
    s->step = step;
}

void sampler_penalty_apply(const sampler *s, float *logits) {
    const float rp = s->p.repetition_penalty, fp = s->p.frequency_penalty, pp = s->p.presence_penalty;
    if (rp == 1 && fp == 0 && pp == 0) return;
    for (int32_t k = 0; k < s->n_distinct; k++) {
        float z = logits[s->d_tok[k]];
        z = z > 0 ? z / rp : z * rp;
        z -= (float)s->d_cnt[k] * fp + pp;
        logits[s->d_tok[k]] = z;
    }
}
