/* The memory plan of a forward (fwd_plan.h). */
#include "model/fwd_plan.h"

#include <stdio.h>

#define GIB(x) ((double)(x) / (double)(1ull << 30))

/* "1.25 GiB", or "12.5 MiB" below a GiB: buf of 32 */
static const char *fmt_bytes(uint64_t b, char *buf)
{
    if (b >= (1ull << 30)) snprintf(buf, 32, "%.2f GiB", GIB(b));
    else snprintf(buf, 32, "%.1f MiB", (double)b / (1 << 20));
    return buf;
}

static uint64_t blocks_for(const fwd_plan_in *in, int n_ctx)
{
    return ((uint64_t)n_ctx + (uint64_t)in->block_tokens - 1) / (uint64_t)in->block_tokens;
}

/* A slot's own bytes (state and per-position buffers), its KV not counted. */
static uint64_t slot_own(const fwd_plan_in *in, int n_ctx)
{
    return in->slot_bytes + (uint64_t)n_ctx * in->pos_bytes;
}

uint64_t fwd_plan_one_slot_bytes(const fwd_plan_in *in, int n_ctx)
{
    return (uint64_t)n_ctx * in->ctx_bytes + slot_own(in, n_ctx) +
           blocks_for(in, n_ctx) * in->block_bytes;
}

static bool one_fits(const fwd_plan_in *in, int n_ctx)
{
    return fwd_plan_one_slot_bytes(in, n_ctx) <= in->room;
}

/* The longest context at most in->n_ctx, a multiple of the step, whose one slot fits; 0 if
 * none. one_fits is monotone in n_ctx, so a binary search over the multiples. */
static int shrink(const fwd_plan_in *in)
{
    const int step = in->block_tokens > FWD_PLAN_CTX_STEP ? in->block_tokens : FWD_PLAN_CTX_STEP;
    int lo = 0, hi = in->n_ctx / step; /* multiples: lo fits (0: none), hi + 1 does not */
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (one_fits(in, mid * step)) lo = mid;
        else hi = mid - 1;
    }
    return lo * step;
}

int fwd_plan_make(const fwd_plan_in *in, fwd_plan *out, status *st)
{
    *out = (fwd_plan){0};
    if (in->n_ctx < 1 || in->block_tokens < 1 || in->n_slots < 0 || in->max_slots < 1 ||
        in->kv_blocks < 0 || !in->block_bytes)
        return status_fail(st, STATUS_INVALID, "memory plan: context %d, blocks of %d positions "
                           "(%llu bytes), %d slots (at most %d), %lld KV blocks", in->n_ctx,
                           in->block_tokens, (unsigned long long)in->block_bytes, in->n_slots,
                           in->max_slots, (long long)in->kv_blocks);
    const char *where = in->room_what ? in->room_what : "the memory there is";
    int ctx = in->n_ctx;
    char shrunk_why[160] = "";
    if (!one_fits(in, ctx)) {
        const uint64_t need = fwd_plan_one_slot_bytes(in, ctx);
        const int fit = in->ctx_fit ? shrink(in) : 0;
        char a[32], b[32];
        if (!fit)
            return status_fail(st, STATUS_NOMEM, "one sequence of %d positions needs %s of state "
                               "and KV; %s are there (%s)", ctx, fmt_bytes(need, a),
                               fmt_bytes(in->room, b), where);
        snprintf(shrunk_why, sizeof shrunk_why, "; the model's %d does not fit: one sequence of "
                 "it needs %s", ctx, fmt_bytes(need, a));
        out->shrunk = true;
        ctx = fit;
    }
    const uint64_t per_seq = blocks_for(in, ctx), own = slot_own(in, ctx);
    const uint64_t avail = in->room - (uint64_t)ctx * in->ctx_bytes; /* one_fits: no underflow */
    const uint64_t full_kv = per_seq * in->block_bytes;
    int64_t n = in->n_slots;
    char slots_why[64] = "given", a[32], b[32], c[32], d[32];
    if (n) {
        if ((uint64_t)n * own + full_kv > avail)
            return status_fail(st, STATUS_NOMEM, "%lld slots of %d positions need %s (%s of "
                               "state each, and one full context of KV, %s); %s are there (%s)",
                               (long long)n, ctx, fmt_bytes((uint64_t)n * own + full_kv, a),
                               fmt_bytes(own, b), fmt_bytes(full_kv, c), fmt_bytes(avail, d),
                               where);
    } else {
        const uint64_t quarter = (per_seq + 3) / 4 * in->block_bytes;
        n = (int64_t)(avail / (own + quarter));
        if (n > in->max_slots) n = in->max_slots;
        while (n > 1 && (uint64_t)n * own + full_kv > avail) n--;
        if (n < 1) n = 1; /* one_fits */
        snprintf(slots_why, sizeof slots_why, "as many as fit a quarter context each, at most %d",
                 in->max_slots);
    }
    int64_t blocks = in->kv_blocks;
    if (blocks) {
        if ((uint64_t)n * own + (uint64_t)blocks * in->block_bytes > avail)
            return status_fail(st, STATUS_NOMEM, "%lld KV blocks of %d positions (%s) and %lld "
                               "slots' state (%s) exceed the %s there (%s)", (long long)blocks,
                               in->block_tokens, fmt_bytes((uint64_t)blocks * in->block_bytes, a),
                               (long long)n, fmt_bytes((uint64_t)n * own, b),
                               fmt_bytes(avail, c), where);
    } else {
        const uint64_t left = (avail - (uint64_t)n * own) / in->block_bytes;
        blocks = (int64_t)((uint64_t)n * per_seq < left ? (uint64_t)n * per_seq : left);
    }
    out->n_ctx = ctx;
    out->n_slots = (int)n;
    out->n_blocks = blocks;
    out->bytes = (uint64_t)ctx * in->ctx_bytes + (uint64_t)n * own + (uint64_t)blocks * in->block_bytes;
    snprintf(out->why, sizeof out->why, "context %d tokens, %d slot%s (%s), KV pool %s (%lld blocks "
             "of %d positions: %.1f full contexts); %s of %s%s", ctx, out->n_slots,
             out->n_slots == 1 ? "" : "s", slots_why, fmt_bytes((uint64_t)blocks * in->block_bytes, a),
             (long long)blocks, in->block_tokens, (double)blocks / (double)per_seq,
             fmt_bytes(out->bytes, b), where, shrunk_why);
    return STATUS_OK;
}
