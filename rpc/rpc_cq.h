/* The tag every completion-queue event of the rpc layer carries: a function to call with the
 * event's outcome. The server's CQ threads (rpc_server.h) call it for their own calls' batches
 * and for any other batch started on their queues (rpc_client.h's asynchronous streams), so one
 * set of threads serves the calls a process answers and the calls it makes. */
#ifndef DS_RPC_RPC_CQ_H
#define DS_RPC_RPC_CQ_H

#include <stdbool.h>

typedef struct rpc_cq_tag rpc_cq_tag;
struct rpc_cq_tag {
    /* Runs on the queue's thread with ok = the event's success; must not block. */
    void (*on_event)(rpc_cq_tag *tag, bool ok);
};

#endif
