/* A map of non-zero 64-bit tags to pointers: open addressing with linear probing (a power of
 * two slots, at most half full), deletion by shifting the entries after the hole back, so no
 * probe chain breaks and no tombstone builds up. Allocates only when it grows. Not
 * thread-safe (the caller's lock). The router's feeds keep their relays by call tag here. */
#ifndef DS_ROUTER_ROUTER_TAGS_H
#define DS_ROUTER_ROUTER_TAGS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct router_tag_slot {
    uint64_t tag; /* 0: empty */
    void *v;
} router_tag_slot;

typedef struct router_tags {
    router_tag_slot *slots; /* owned, [cap]; a zeroed struct is an empty map */
    size_t cap, n;
} router_tags;

/* Adds tag (non-zero, not present) -> v. 0, or -1 when out of memory (nothing added). */
int router_tags_put(router_tags *t, uint64_t tag, void *v);
/* The value of tag, or NULL when absent. */
void *router_tags_get(const router_tags *t, uint64_t tag);
/* Removes tag; false when it was absent. */
bool router_tags_remove(router_tags *t, uint64_t tag);
void router_tags_free(router_tags *t);
#endif
