/* TLS material for the gRPC server and client: PEM files read into the credentials gRPC C core
 * wants (grpc_ssl_server_credentials_create_ex, grpc_ssl_credentials_create).
 *
 * Server: cert + key on the port; with client_ca_file the server requires and verifies client
 * certificates (mTLS, GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY).
 * Client: ca_file verifies the server; cert_file + key_file are presented (mTLS), optional;
 * target_name, when set, is the name the server's certificate is checked against instead of the
 * host of the address dialled (gRPC's SSL target-name override: a worker dialled by IP verified
 * under its Service's DNS name).
 * Errors name the flag and the file: STATUS_IO (cannot read), STATUS_INVALID (not PEM, or a
 * half-given pair). */
#ifndef DS_RPC_RPC_TLS_H
#define DS_RPC_RPC_TLS_H

#include <grpc/grpc_security.h>

#include "common/status.h"

typedef struct rpc_tls_server {
    const char *cert_file;      /* PEM certificate chain of this server */
    const char *key_file;       /* PEM private key */
    const char *client_ca_file; /* NULL: no client certificates asked; else required + verified */
} rpc_tls_server;

typedef struct rpc_tls_client {
    const char *ca_file;   /* PEM roots that verify the server; NULL: the system's roots */
    const char *cert_file; /* client certificate (mTLS), or NULL */
    const char *key_file;  /* its key, or NULL */
    const char *target_name; /* name verified in the server's certificate; NULL: the host dialled */
} rpc_tls_client;

/* Reads a whole file into a NUL-terminated malloc'd string (*out, caller frees). */
int rpc_tls_read_file(const char *path, const char *what, char **out, status *st);

/* rpc_tls_read_file of a PEM file: STATUS_INVALID "<what> <path>: not a PEM file ..." when it
 * holds no "-----BEGIN " line. */
int rpc_tls_read_pem(const char *path, const char *what, char **out, status *st);

/* Server credentials from t (caller releases them). */
int rpc_tls_server_creds(const rpc_tls_server *t, grpc_server_credentials **out, status *st);

/* Channel credentials from t (caller releases them). Every file is read and checked here, so a
 * caller that creates them once at start-up reports a bad flag before serving. */
int rpc_tls_client_creds(const rpc_tls_client *t, grpc_channel_credentials **out, status *st);

#endif
