/* Bearer-token authentication for an rpc_server (--auth-token-file), and the token a client
 * sends (rpc_auth_bearer: the router's --worker-token-file, `deltaserve client
 * --auth-token-file`).
 *
 * The token is the file's content without surrounding whitespace. A call is allowed when its
 * "authorization" metadata is "Bearer <token>", the scheme in any case ("bearer", "BEARER",
 * RFC 7235) and the token exactly; the comparison takes the same time
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

/* Reads the token file: STATUS_IO (cannot read), STATUS_INVALID (empty or too long); the
 * messages name --auth-token-file. */
int rpc_auth_create(const char *path, rpc_auth **out, status *st);
/* The same, the messages naming flag (e.g. "--worker-token-file"). */
int rpc_auth_create_flag(const char *path, const char *flag, rpc_auth **out, status *st);
void rpc_auth_destroy(rpc_auth *a);

/* true when value[0..len) (the "authorization" metadata value; NULL = absent) is
 * "Bearer <token>". May re-read the file (see above). */
bool rpc_auth_check(rpc_auth *a, const char *value, size_t len);

/* Copies "Bearer <token>" (the current token; may re-read the file as above) into buf, which
 * holds RPC_AUTH_MAX_VALUE bytes; returns its length (not NUL-terminated). */
#define RPC_AUTH_MAX_VALUE (sizeof "Bearer " - 1 + RPC_AUTH_MAX_TOKEN)
size_t rpc_auth_bearer(rpc_auth *a, char *buf);

#endif
