#include "rpc/rpc_tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RPC_TLS_MAX_FILE_BYTES (1 << 20)

int rpc_tls_read_file(const char *path, const char *what, char **out, status *st)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return status_fail(st, STATUS_IO, "%s %s: %s", what, path, strerror(errno));
    char *buf = malloc(RPC_TLS_MAX_FILE_BYTES + 1);
    if (!buf) {
        fclose(f);
        return status_fail(st, STATUS_NOMEM, "%s %s: out of memory", what, path);
    }
    size_t n = fread(buf, 1, RPC_TLS_MAX_FILE_BYTES + 1, f);
    int err = ferror(f);
    fclose(f);
    if (err || n == 0 || n > RPC_TLS_MAX_FILE_BYTES) {
        free(buf);
        return status_fail(st, STATUS_IO, "%s %s: %s", what, path,
                           err ? "read error" : n == 0 ? "empty file" : "larger than 1 MiB");
    }
    buf[n] = '\0';
    *out = buf;
    return STATUS_OK;
}

int rpc_tls_read_pem(const char *path, const char *what, char **out, status *st)
{
    int rc = rpc_tls_read_file(path, what, out, st);
    if (rc) return rc;
    if (!strstr(*out, "-----BEGIN ")) {
        free(*out);
        *out = NULL;
        return status_fail(st, STATUS_INVALID, "%s %s: not a PEM file (no '-----BEGIN' line)",
                           what, path);
    }
    return STATUS_OK;
}

int rpc_tls_server_creds(const rpc_tls_server *t, grpc_server_credentials **out, status *st)
{
    *out = NULL;
    if (!t->cert_file || !t->key_file)
        return status_fail(st, STATUS_INVALID, "TLS: give both --tls-cert and --tls-key");
    char *cert = NULL, *key = NULL, *ca = NULL;
    int rc;
    if ((rc = rpc_tls_read_pem(t->cert_file, "--tls-cert", &cert, st)) ||
        (rc = rpc_tls_read_pem(t->key_file, "--tls-key", &key, st)) ||
        (t->client_ca_file &&
         (rc = rpc_tls_read_pem(t->client_ca_file, "--tls-client-ca", &ca, st))))
        goto done;
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    *out = grpc_ssl_server_credentials_create_ex(
        ca, &pair, 1,
        ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
           : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
    if (!*out) rc = status_fail(st, STATUS_INVALID, "TLS: %s / %s: not a usable certificate and key",
                                t->cert_file, t->key_file);
done:
    free(cert);
    free(key);
    free(ca);
    return rc;
}

int rpc_tls_client_creds(const rpc_tls_client *t, grpc_channel_credentials **out, status *st)
{
    *out = NULL;
    if (!t->cert_file != !t->key_file)
        return status_fail(st, STATUS_INVALID, "TLS: give both --tls-client-cert and --tls-client-key");
    char *ca = NULL, *cert = NULL, *key = NULL;
    int rc = STATUS_OK;
    if ((t->ca_file && (rc = rpc_tls_read_pem(t->ca_file, "--tls-ca", &ca, st))) ||
        (t->cert_file && (rc = rpc_tls_read_pem(t->cert_file, "--tls-client-cert", &cert, st))) ||
        (t->key_file && (rc = rpc_tls_read_pem(t->key_file, "--tls-client-key", &key, st))))
        goto done;
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    *out = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
    if (!*out) rc = status_fail(st, STATUS_INVALID, "TLS: cannot make client credentials");
done:
    free(ca);
    free(cert);
    free(key);
    return rc;
}
