/* Bearer-token authentication for an rpc_server (--auth-token-file).
 *
 * The token is the file's content without surrounding whitespace. A call is allowed when its
 * "authorization" metadata is exactly "Bearer <token>"; the comparison takes the same time
 * whatever the offered value holds (constant time in the expected token's length). The file
 * is watched: at most once a second a check stats it, and when its mtime, size or inode
 * changed it is read again (a file that is empty or unreadable then keeps the old token and
 * is retried a second later). Nothing is allocated per call. Thread-safe.
 *
 *   rpc_auth *a;  rpc_auth_create("/etc/deltaserve/token", &a, &st);
 *   rpc_server_opts so = {.listen = ..., .auth = a};  ... rpc_server_require_auth(srv, "/pkg.Svc/");
 *   ... after rpc_server_destroy: rpc_auth_destroy(a); */
#ifndef DS_RPC_RPC_AUTH_H
#define DS_RPC_RPC_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

#define RPC_AUTH_MAX_TOKEN 4096
#define RPC_AUTH_RELOAD_MS 1000

typedef struct rpc_auth rpc_auth;

/* Reads the token file: STATUS_IO (cannot read), STATUS_INVALID (empty or too long). */
int rpc_auth_create(const char *path, rpc_auth **out, status *st);
void rpc_auth_destroy(rpc_auth *a);

/* true when value[0..len) (the "authorization" metadata value; NULL = absent) is
 * "Bearer <token>". May re-read the file (see above). */
bool rpc_auth_check(rpc_auth *a, const char *value, size_t len);

#endif
