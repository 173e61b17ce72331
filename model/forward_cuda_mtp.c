/* The MTP head on one rank (forward_cuda_impl.h fc_mtp; fwd.h mtp_feed / mtp_draft): a feed's
 * rows in batched passes (fc_record_mtp_rows: the batched step's kernels, staged as its passes
 * are), a draft's rows one after another (fc_record_mtp_row: the one-row step's), launched
 * directly on the stream; their inputs staged in pinned rings and copied on the same stream, so
 * a feed costs no host sync and a draft one, before its argmax keys are read. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "model/forward_cuda_impl.h"

void fc_mtp_layout(fc_rank *e, fc_arena *a)
{
    fc_mtp *m = &e->mtp;
    if (!m->on || !e->b.rows) return;
    const int64_t H = e->cfg.H;
    int P = e->b.rows;
    while (P > 1 && e->dense.from > 0 && P >= e->dense.from) P /= 2;
    m->pass_rows = P;
    m->d_cat = fc_arena_take(a, (uint64_t)P * 2 * H * 4);
    m->d_catq = fc_arena_take(a, gemv_xq_bytes(2 * H));
    m->d_hin = fc_arena_take(a, (uint64_t)P * H * 4);
    m->d_g = fc_arena_take(a, (uint64_t)H * 4);
    m->d_in = fc_arena_take(a, 5 * 4);
    m->d_best = fc_arena_take(a, 8);
}

/* The rings hold a step's rows and a pass's staging for every slot: what the engine stages
 * between two syncs unless several slots flush long queues in one step (worker/spec.h
 * spec_flush), when a full ring waits for the stream. */
int fc_mtp_alloc_host(fc_rank *e, status *st)
{
    fc_mtp *m = &e->mtp;
    if (!m->on || !e->b.rows) return STATUS_OK;
    m->ring_rows = e->max_rows + m->pass_rows;
    m->iring_cap = (e->n_slots + 8) * FC_STAGE_INTS(e->b.rows);
    const size_t floats = (size_t)m->ring_rows * (size_t)e->cfg.H;
    void *p = NULL;
    if (cuda_host_alloc(&p, floats * 4 + (size_t)m->iring_cap * 4 + FWD_MAX_VERIFY_ROWS * 8,
                        "pinned MTP inputs", st))
        return st->code;
    m->h_ring = p;
    m->h_iring = (int32_t *)(m->h_ring + floats);
    m->h_best = (unsigned long long *)(m->h_iring + m->iring_cap);
    m->ring_steps = e->stats.steps;
    m->rows = calloc((size_t)m->pass_rows, sizeof *m->rows);
    m->heads = calloc((size_t)m->pass_rows, sizeof *m->heads);
    if (!m->rows || !m->heads) return status_fail(st, STATUS_NOMEM, "cuda: MTP rows");
    return STATUS_OK;
}

void fc_mtp_destroy(fc_rank *e)
{
    cuda_host_free(e->mtp.h_ring);
    free(e->mtp.rows);
    free(e->mtp.heads);
    e->mtp.h_ring = NULL;
    e->mtp.rows = NULL;
    e->mtp.heads = NULL;
}

/* Room in the rings for `rows` hidden rows and n_int ints. A step's sync (or a draft's) drains
 * every copy staged before it; past that, a full ring waits for the stream. */
static int ring_take(fc_rank *e, int rows, int n_int, float **h, int32_t **in, status *st)
{
    fc_mtp *m = &e->mtp;
    if (m->ring_steps != e->stats.steps) {
        m->ring_steps = e->stats.steps;
        m->ring_used = m->iring_used = 0;
    }
    if (m->ring_used + rows > m->ring_rows || m->iring_used + n_int > m->iring_cap) {
        if (cuda_sync(e->launch.stream, "MTP input ring", st)) return st->code;
        m->ring_used = m->iring_used = 0;
    }
    *h = m->h_ring + (size_t)m->ring_used * (size_t)e->cfg.H;
    *in = m->h_iring + m->iring_used;
    m->ring_used += rows;
    m->iring_used += n_int;
    return STATUS_OK;
}

/* T rows in passes of at most pass_rows: each pass's hidden rows and staging (fc_stage_pass, as
 * a batched step stages its rows) copied behind whatever ran before, then its kernels. */
int fc_rank_mtp_feed(fc_rank *e, int slot, int pos, const float *hidden, const int32_t *tokens,
                     int T, status *st)
{
    fc_mtp *m = &e->mtp;
    fc_batch *b = &e->b;
    const size_t H = (size_t)e->cfg.H;
    fc_kv_sync(e, slot, pos + T - 1);
    for (int r0 = 0; r0 < T; r0 += m->pass_rows) {
        const int n = T - r0 < m->pass_rows ? T - r0 : m->pass_rows;
        float *h = NULL;
        int32_t *in = NULL;
        if (ring_take(e, n, FC_STAGE_INTS(b->rows), &h, &in, st)) return st->code;
        for (int i = 0; i < n; i++)
            m->rows[i] = (fwd_row){.token = tokens[r0 + i], .slot = slot, .pos = pos + r0 + i,
                                   .prompt = true};
        fc_pass_info info;
        fc_stage_pass(m->rows, n, b->bucket, b->n_buckets, e->n_slots, false, NULL, in, m->heads,
                      &info);
        m->iring_used -= FC_STAGE_INTS(b->rows) - info.staged_ints; /* what it did not use */
        memcpy(h, hidden + (size_t)r0 * H, (size_t)n * H * 4);
        cuda_copy_h2d_async(m->d_hin, h, (size_t)n * H * 4, e->launch.stream);
        cuda_copy_h2d_async(b->stage[info.k].head_rows, in, (size_t)info.staged_ints * 4,
                            e->launch.stream);
        fc_record_mtp_rows(e, &b->stage[info.k], m->d_hin);
        e->stats.h2d_bytes += (uint64_t)n * H * 4 + (uint64_t)info.staged_ints * 4;
    }
    return cuda_check("MTP feed", st);
}

int fc_rank_mtp_draft(fc_rank *e, int slot, int pos, const float *h, int32_t token, int k,
                      int32_t *drafts, status *st)
{
    fc_mtp *m = &e->mtp;
    const size_t H = (size_t)e->cfg.H;
    fc_kv_sync(e, slot, pos + k);
    float *hs = NULL;
    int32_t *in = NULL;
    if (ring_take(e, 1, 5, &hs, &in, st)) return st->code;
    memcpy(hs, h, H * 4);
    in[0] = pos - 1; /* gemv_embed_step makes it {pos, pos + 1} */
    in[1] = pos;
    in[2] = in[3] = 0;
    in[4] = token;
    cuda_copy_h2d_async(m->d_hin, hs, H * 4, e->launch.stream);
    cuda_copy_h2d_async(m->d_in, in, 5 * 4, e->launch.stream);
    for (int i = 0; i < k; i++) { /* row i's input: h, then the last row's g */
        fc_record_mtp_row(e, slot, i ? m->d_g : m->d_hin, i == 0, true);
        cuda_copy_d2h_async(&m->h_best[i], m->d_best, 8, e->launch.stream);
    }
    if (cuda_sync(e->launch.stream, "MTP draft", st)) return st->code;
    m->ring_used = m->iring_used = 0;
    e->stats.h2d_bytes += H * 4 + 5 * 4;
    e->stats.d2h_bytes += (uint64_t)k * 8;
    for (int i = 0; i < k; i++) drafts[i] = gemv_argmax_row(m->h_best[i]);
    return cuda_check("MTP draft", st);
}
