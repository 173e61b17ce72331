/* The MTP head on one rank (forward_cuda_impl.h fc_mtp; fwd.h mtp_feed / mtp_draft): rows of
 * model/mtp.c run_rows launched one after another on the stream (fc_record_mtp_row), their
 * inputs staged in pinned rings and copied on the same stream, so a feed costs no host sync and
 * a draft one, before its argmax keys are read. */
#include <string.h>

#include "common/log.h"
#include "model/forward_cuda_impl.h"

void fc_mtp_layout(fc_rank *e, fc_arena *a)
{
    fc_mtp *m = &e->mtp;
    if (!m->on) return;
    const int64_t H = e->cfg.H;
    m->d_cat = fc_arena_take(a, 2 * (uint64_t)H * 4);
    m->d_catq = fc_arena_take(a, gemv_xq_bytes(2 * H));
    m->d_hin = fc_arena_take(a, (uint64_t)FC_MTP_ROWS * H * 4);
    m->d_g = fc_arena_take(a, (uint64_t)H * 4);
    m->d_in = fc_arena_take(a, (4 + FC_MTP_ROWS) * 4);
    m->d_best = fc_arena_take(a, 8);
}

/* The rings hold what can be staged between two syncs: a step's rows (every feed after a step
 * pairs rows that step ran) and a draft's first row, with the ints of a piece per row at most. */
int fc_mtp_alloc_host(fc_rank *e, status *st)
{
    fc_mtp *m = &e->mtp;
    if (!m->on) return STATUS_OK;
    m->ring_rows = e->max_rows + FC_MTP_ROWS;
    m->iring_cap = 5 * m->ring_rows;
    const size_t floats = (size_t)m->ring_rows * (size_t)e->cfg.H;
    void *p = NULL;
    if (cuda_host_alloc(&p, floats * 4 + (size_t)m->iring_cap * 4 + FWD_MAX_VERIFY_ROWS * 8,
                        "pinned MTP inputs", st))
        return st->code;
    m->h_ring = p;
    m->h_iring = (int32_t *)(m->h_ring + floats);
    m->h_best = (unsigned long long *)(m->h_iring + m->iring_cap);
    m->ring_steps = e->stats.steps;
    return STATUS_OK;
}

void fc_mtp_destroy(fc_rank *e)
{
    cuda_host_free(e->mtp.h_ring);
    e->mtp.h_ring = NULL;
}

/* Room in the rings for `rows` hidden rows and n_int ints. A step's sync drains every copy
 * staged before it; past that, a full ring waits for the stream (not in the engine's use,
 * whose feeds between two steps hold that step's rows at most). */
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

/* Stages n rows' hidden inputs and tokens for rows from position pos, and copies them to the
 * device behind whatever ran before. */
static int stage(fc_rank *e, int pos, const float *hidden, const int32_t *tokens, int n,
                 status *st)
{
    fc_mtp *m = &e->mtp;
    const size_t H = (size_t)e->cfg.H;
    float *h = NULL;
    int32_t *in = NULL;
    if (ring_take(e, n, 4 + n, &h, &in, st)) return st->code;
    memcpy(h, hidden, (size_t)n * H * 4);
    in[0] = pos - 1; /* gemv_embed_step makes it {pos, pos + 1} */
    in[1] = pos;
    in[2] = in[3] = 0;
    memcpy(in + 4, tokens, (size_t)n * 4);
    cuda_copy_h2d_async(m->d_hin, h, (size_t)n * H * 4, e->launch.stream);
    cuda_copy_h2d_async(m->d_in, in, (size_t)(4 + n) * 4, e->launch.stream);
    return STATUS_OK;
}

int fc_rank_mtp_feed(fc_rank *e, int slot, int pos, const float *hidden, const int32_t *tokens,
                     int T, status *st)
{
    const size_t H = (size_t)e->cfg.H;
    fc_kv_sync(e, slot, pos + T - 1);
    for (int r0 = 0; r0 < T; r0 += FC_MTP_ROWS) {
        const int n = T - r0 < FC_MTP_ROWS ? T - r0 : FC_MTP_ROWS;
        if (stage(e, pos + r0, hidden + (size_t)r0 * H, tokens + r0, n, st)) return st->code;
        for (int r = 0; r < n; r++)
            fc_record_mtp_row(e, slot, e->mtp.d_hin + (size_t)r * H, true, false);
    }
    return cuda_check("MTP feed", st);
}

int fc_rank_mtp_draft(fc_rank *e, int slot, int pos, const float *h, int32_t token, int k,
                      int32_t *drafts, status *st)
{
    fc_mtp *m = &e->mtp;
    fc_kv_sync(e, slot, pos + k);
    if (stage(e, pos, h, &token, 1, st)) return st->code;
    for (int i = 0; i < k; i++) { /* row i's input: h, then the last row's g */
        fc_record_mtp_row(e, slot, i ? m->d_g : m->d_hin, i == 0, true);
        cuda_copy_d2h_async(&m->h_best[i], m->d_best, 8, e->launch.stream);
    }
    if (cuda_sync(e->launch.stream, "MTP draft", st)) return st->code;
    m->ring_used = m->iring_used = 0;
    for (int i = 0; i < k; i++) drafts[i] = gemv_argmax_row(m->h_best[i]);
    return STATUS_OK;
}
