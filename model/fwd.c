/* The registry lookups of the forward contract (fwd.h); the table itself is the registry
 * library's (model/BUILD: backends_cpu, backends_all). */
#include "model/fwd.h"

#include <string.h>

const fwd_backend *fwd_backend_find(const char *name)
{
    for (int i = 0; name && fwd_backends[i]; i++)
        if (strcmp(fwd_backends[i]->name, name) == 0) return fwd_backends[i];
    return NULL;
}

int fwd_state_dtype_parse(const char *text, fwd_state_dtype *out, status *st)
{
    if (text && !strcmp(text, "f32")) *out = FWD_STATE_F32;
    else if (text && !strcmp(text, "bf16")) *out = FWD_STATE_BF16;
    else if (text && !strcmp(text, "auto")) *out = FWD_STATE_AUTO;
    else return status_fail(st, STATUS_INVALID, "state dtype must be f32, bf16 or auto, not '%s'",
                            text ? text : "(null)");
    return STATUS_OK;
}

const char *fwd_state_dtype_name(fwd_state_dtype t)
{
    return t == FWD_STATE_BF16 ? "bf16" : t == FWD_STATE_AUTO ? "auto" : "f32";
}

int fwd_create(const char *name, const qwen35_model *m, const fwd_opts *o, fwd **out, status *st)
{
    *out = NULL;
    const fwd_backend *b = fwd_backend_find(name);
    if (!b) return status_fail(st, STATUS_INVALID, "device '%s': this binary has no such backend",
                               name ? name : "(null)");
    if (o->state_dtype != FWD_STATE_F32 && o->state_dtype != FWD_STATE_BF16 &&
        o->state_dtype != FWD_STATE_AUTO)
        return status_fail(st, STATUS_INVALID, "state dtype %d: expected f32, bf16 or auto",
                           (int)o->state_dtype);
    fwd_opts fo = *o;
    if (fo.state_dtype == FWD_STATE_AUTO)
        fo.state_dtype = strcmp(name, "cuda") ? FWD_STATE_F32 : FWD_STATE_BF16;
    return b->create(m, &fo, out, st);
}

int fwd_check_verify(const fwd *f, const fwd_row *rows, int n, status *st)
{
    for (int i = 0, run = 0; i < n; i++) {
        const bool cont = i > 0 && rows[i - 1].slot == rows[i].slot;
        run = cont ? run + 1 : 1;
        if ((rows[i].verify || rows[i].hidden) && !f->verify_rows)
            return status_fail(st, STATUS_UNSUPPORTED, "row %d: %s runs no verify rows nor "
                               "hidden outputs (speculative decoding)", i, f->device);
        if (cont && rows[i].verify != rows[i - 1].verify)
            return status_fail(st, STATUS_RANGE, "row %d: slot %d's run mixes verify rows and "
                               "others", i, rows[i].slot);
        if (rows[i].verify && run > f->verify_rows)
            return status_fail(st, STATUS_RANGE, "row %d: slot %d's verify run is longer than %d "
                               "rows", i, rows[i].slot, f->verify_rows);
    }
    return STATUS_OK;
}

int fwd_take_blocks(fwd *f, const fwd_row *rows, int n, status *st)
{
    uint64_t need = 0;
    for (int i = 0; i < n; i++)
        if (i + 1 == n || rows[i + 1].slot != rows[i].slot) /* a run's last row */
            need += kv_pool_need(f->kv, rows[i].slot, (int64_t)rows[i].pos + 1);
    if (!need) return STATUS_OK;
    if (need > kv_pool_free_blocks(f->kv))
        return status_fail(st, STATUS_EXHAUSTED, "%s: the step needs %llu more KV blocks of %d "
                           "positions, %u of %u are free", f->device, (unsigned long long)need,
                           kv_pool_block_tokens(f->kv), kv_pool_free_blocks(f->kv),
                           kv_pool_total_blocks(f->kv));
    for (int i = 0; i < n; i++)
        if ((i + 1 == n || rows[i + 1].slot != rows[i].slot) &&
            kv_pool_ensure(f->kv, rows[i].slot, (int64_t)rows[i].pos + 1, st))
            return st->code; /* not reached: counted above */
    return STATUS_OK;
}
