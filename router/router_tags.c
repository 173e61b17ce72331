/* router_tags.h */
#include "router/router_tags.h"

#include <stdlib.h>

#include "common/splitmix64.h"

#define TAGS0 256 /* the first size (a power of two) */

static size_t home_of(uint64_t tag, size_t cap) { return (size_t)(splitmix64(tag) & (cap - 1)); }

static void place(router_tag_slot *s, size_t cap, router_tag_slot e)
{
    size_t j = home_of(e.tag, cap);
    while (s[j].tag) j = (j + 1) & (cap - 1);
    s[j] = e;
}

int router_tags_put(router_tags *t, uint64_t tag, void *v)
{
    if (2 * (t->n + 1) > t->cap) {
        const size_t cap = t->cap ? 2 * t->cap : TAGS0;
        router_tag_slot *s = calloc(cap, sizeof *s);
        if (!s) return -1;
        for (size_t i = 0; i < t->cap; i++)
            if (t->slots[i].tag) place(s, cap, t->slots[i]);
        free(t->slots);
        t->slots = s;
        t->cap = cap;
    }
    place(t->slots, t->cap, (router_tag_slot){tag, v});
    t->n++;
    return 0;
}

/* The slot of tag, or -1. */
static long find(const router_tags *t, uint64_t tag)
{
    if (!t->cap) return -1;
    for (size_t j = home_of(tag, t->cap);; j = (j + 1) & (t->cap - 1)) {
        if (!t->slots[j].tag) return -1;
        if (t->slots[j].tag == tag) return (long)j;
    }
}

void *router_tags_get(const router_tags *t, uint64_t tag)
{
    const long j = find(t, tag);
    return j >= 0 ? t->slots[j].v : NULL;
}

bool router_tags_remove(router_tags *t, uint64_t tag)
{
    const long f = find(t, tag);
    if (f < 0) return false;
    const size_t m = t->cap - 1;
    size_t i = (size_t)f;
    t->slots[i].tag = 0;
    t->n--;
    for (size_t j = (i + 1) & m; t->slots[j].tag; j = (j + 1) & m) {
        /* the entry at j may fill the hole at i when its home is not in (i, j] cyclically */
        if (((j - home_of(t->slots[j].tag, t->cap)) & m) >= ((j - i) & m)) {
            t->slots[i] = t->slots[j];
            t->slots[j].tag = 0;
            i = j;
        }
    }
    return true;
}

void router_tags_free(router_tags *t)
{
    free(t->slots);
    *t = (router_tags){0};
}
