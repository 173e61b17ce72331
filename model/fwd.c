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

int fwd_create(const char *name, const qwen35_model *m, const fwd_opts *o, fwd **out, status *st)
{
    *out = NULL;
    const fwd_backend *b = fwd_backend_find(name);
    if (!b) return status_fail(st, STATUS_INVALID, "device '%s': this binary has no such backend",
                               name ? name : "(null)");
    return b->create(m, o, out, st);
}
