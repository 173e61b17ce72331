/* Status codes and messages: the one error vocabulary of deltaserve.
 *
 * A failing function sets a code and a message naming the object (file and byte offset,
 * tensor name, request id) and returns the code, so an error path is one line:
 *     if (n > size) return status_fail(st, STATUS_FORMAT, "%s: offset %llu: ...", path, off);
 * Broken invariants (caller bugs) use DS_ASSERT, which is always on and aborts. */
#ifndef DS_COMMON_STATUS_H
#define DS_COMMON_STATUS_H

#include <stdio.h>
#include <stdlib.h>

typedef enum status_code {
    STATUS_OK = 0,
    STATUS_INVALID,     /* bad argument or request field */
    STATUS_IO,          /* open/read/write/mmap failed */
    STATUS_NOMEM,       /* allocation failed */
    STATUS_FORMAT,      /* malformed file content */
    STATUS_UNSUPPORTED, /* well-formed but not handled (type, version, arch) */
    STATUS_NOT_FOUND,   /* missing key, tensor, file */
    STATUS_RANGE,       /* value out of the allowed range (context overflow, id >= vocab) */
    STATUS_EXHAUSTED,   /* queue or pool full */
    STATUS_UNAVAILABLE, /* peer gone, draining */
    STATUS_CANCELLED,
    STATUS_DEADLINE,
    STATUS_DEVICE,      /* CUDA / NCCL failure */
    STATUS_INTERNAL,    /* a bug */
    STATUS_UNAUTHENTICATED, /* missing or wrong credentials (bearer token) */
    STATUS_PRECONDITION, /* the server cannot do this at all (no chat template): FAILED_PRECONDITION */
} status_code;

typedef struct status {
    status_code code;
    char msg[512];
} status;

/* Sets st->code and st->msg (printf-style) and returns code. st may be NULL. */
int status_fail(status *st, status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Resets st to STATUS_OK with an empty message. */
void status_clear(status *st);

/* A short upper-case name for a code, e.g. "FORMAT". */
const char *status_code_name(status_code code);

/* Always-on invariant check: prints expression, file and line, then aborts. */
#define DS_ASSERT(expr)                                                                    \
    do {                                                                                   \
        if (!(expr)) {                                                                     \
            fprintf(stderr, "deltaserve: assertion failed: %s at %s:%d\n", #expr, __FILE__, \
                    __LINE__);                                                             \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

#endif
