/* Why a generation ended: one numbering and one name table for the engine
 * (engine_request.finish), the wire (proto FinishReason: the same numbers) and the router's logs
 * and metrics labels. */
#ifndef DS_COMMON_FINISH_H
#define DS_COMMON_FINISH_H

typedef enum finish_reason {
    FINISH_NONE = 0,  /* not finished (proto FINISH_REASON_UNSPECIFIED) */
    FINISH_STOP,      /* eos, a stop token or a stop string */
    FINISH_LENGTH,    /* max_new_tokens or the end of the context */
    FINISH_CANCELLED, /* client cancel, deadline, Worker/Abort, drain */
    FINISH_ERROR,     /* the gRPC status says which */
    FINISH_N
} finish_reason;

/* "stop", "length", "cancelled", "error"; "" for FINISH_NONE and "?" outside the enum. */
const char *finish_reason_name(int f);

#endif
