/* Stop-string matcher for a stream of detokenized text pieces.
 *
 * The router feeds every text piece it gets from the streaming detokenizer; the matcher returns
 * the text that is safe to send now. Text that could be the beginning of a stop string is held
 * back until the next piece decides it: either a stop string completes (the text before it is
 * released, the stop text itself is trimmed, and the stream ends) or it cannot match any more
 * (the held text is released). At the end of a stream without a match, router_stop_flush
 * releases what is still held.
 *
 * Pieces are complete UTF-8 sequences and stop strings are validated UTF-8, so a held-back
 * suffix always starts on a character boundary: released text never splits a character.
 * When several stop strings match, the one starting earliest wins; at equal starts, the one
 * listed first. Memory: one buffer per matcher, grown only when a piece is longer than any
 * seen before (never per token in steady state). */
#ifndef DS_ROUTER_ROUTER_STOP_H
#define DS_ROUTER_ROUTER_STOP_H

#include <stddef.h>

#include "common/status.h"

#define ROUTER_STOP_MAX 16        /* stop strings per request */
#define ROUTER_STOP_MAX_BYTES 256 /* bytes per stop string */

typedef struct router_stop {
    const char *stops[ROUTER_STOP_MAX]; /* borrowed from the request, [n_stops] */
    size_t stop_len[ROUTER_STOP_MAX];
    int n_stops;
    char *buf;       /* owned, [cap] bytes: held text, then the released prefix of a push */
    size_t len;      /* bytes in buf */
    size_t released; /* bytes at the front of buf handed out by the last push */
    size_t cap;
    int matched;     /* index of the stop string that matched, -1 while none */
} router_stop;

/* Validates the stop strings (count <= ROUTER_STOP_MAX, each non-empty, <= ROUTER_STOP_MAX_BYTES,
 * valid UTF-8) and sets up the matcher; the strings are borrowed and must outlive it. Errors are
 * STATUS_INVALID naming "stop[i]". n == 0 gives a pass-through matcher. */
int router_stop_init(router_stop *s, const char *const *stops, int n, status *st);
void router_stop_free(router_stop *s);

/* Feeds one piece. Sets *out / *n_out to the text to send now (valid until the next call) and
 * returns the index of the stop string that matched (the stream must end; *out is the text
 * before the stop), or -1. After a match, further pushes release nothing and return the same
 * index. Returns -2 on allocation failure (st set). */
int router_stop_push(router_stop *s, const char *piece, size_t n, const char **out, size_t *n_out,
                     status *st);

/* End of stream without a match: releases the held-back text. */
void router_stop_flush(router_stop *s, const char **out, size_t *n_out);

#endif
