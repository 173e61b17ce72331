#include "rpc/rpc_auth.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/clock.h"
#include "common/log.h"

#define BEARER "Bearer "

struct rpc_auth {
    char path[1024];
    char flag[64];      /* named in messages */
    pthread_mutex_t mu; /* guards the fields below */
    char expected[sizeof BEARER - 1 + RPC_AUTH_MAX_TOKEN + 1]; /* "Bearer <token>" */
    size_t n_expected;
    int64_t checked_ms; /* last stat, clock_now_ms */
    struct stat seen;   /* the file as last read */
};

/* Reads the token into a->expected (mu held or not yet shared). */
static int load(rpc_auth *a, const struct stat *sb, status *st)
{
    FILE *f = fopen(a->path, "rb");
    if (!f) return status_fail(st, STATUS_IO, "%s %s: %s", a->flag, a->path, strerror(errno));
    char buf[RPC_AUTH_MAX_TOKEN + 2];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t b = 0;
    while (b < n && isspace((unsigned char)buf[b])) b++;
    while (n > b && isspace((unsigned char)buf[n - 1])) n--;
    if (n == b || n - b > RPC_AUTH_MAX_TOKEN)
        return status_fail(st, STATUS_INVALID, "%s %s: %s", a->flag, a->path,
                           n == b ? "empty token" : "token longer than 4096 bytes");
    memcpy(a->expected, BEARER, sizeof BEARER - 1);
    memcpy(a->expected + sizeof BEARER - 1, buf + b, n - b);
    a->n_expected = sizeof BEARER - 1 + (n - b);
    a->seen = *sb;
    return STATUS_OK;
}

int rpc_auth_create(const char *path, rpc_auth **out, status *st)
{
    return rpc_auth_create_flag(path, "--auth-token-file", out, st);
}

int rpc_auth_create_flag(const char *path, const char *flag, rpc_auth **out, status *st)
{
    *out = NULL;
    rpc_auth *a = calloc(1, sizeof *a);
    if (!a) return status_fail(st, STATUS_NOMEM, "rpc auth: out of memory");
    snprintf(a->path, sizeof a->path, "%s", path);
    snprintf(a->flag, sizeof a->flag, "%s", flag);
    struct stat sb;
    int rc;
    if (stat(path, &sb)) rc = status_fail(st, STATUS_IO, "%s %s: %s", flag, path, strerror(errno));
    else rc = load(a, &sb, st);
    if (rc) {
        free(a);
        return rc;
    }
    pthread_mutex_init(&a->mu, NULL);
    a->checked_ms = clock_now_ms();
    *out = a;
    return STATUS_OK;
}

void rpc_auth_destroy(rpc_auth *a)
{
    if (!a) return;
    pthread_mutex_destroy(&a->mu);
    free(a);
}

static bool same_file(const struct stat *x, const struct stat *y)
{
    return x->st_ino == y->st_ino && x->st_dev == y->st_dev && x->st_size == y->st_size &&
           x->st_mtim.tv_sec == y->st_mtim.tv_sec && x->st_mtim.tv_nsec == y->st_mtim.tv_nsec;
}

/* mu held: re-reads the file when it changed, at most once per RPC_AUTH_RELOAD_MS. */
static void maybe_reload(rpc_auth *a)
{
    int64_t now = clock_now_ms();
    if (now - a->checked_ms >= RPC_AUTH_RELOAD_MS) {
        a->checked_ms = now;
        struct stat sb;
        status st;
        if (stat(a->path, &sb) == 0 && !same_file(&sb, &a->seen)) {
            if (load(a, &sb, &st)) LOG_WARN("rpc auth: %s (keeping the previous token)", st.msg);
            else LOG_INFO("rpc auth: token re-read from %s", a->path);
        }
    }
}

bool rpc_auth_check(rpc_auth *a, const char *value, size_t len)
{
    pthread_mutex_lock(&a->mu);
    maybe_reload(a);
    /* constant time in the expected length: every byte is looked at whatever differs. The
     * scheme ("Bearer", the first 6 bytes) compares in any case: ASCII letters are folded to
     * lower case on both sides with a bit (0x20) that only letters are given. */
    unsigned diff = value ? (unsigned)(len != a->n_expected) : 1u;
    for (size_t i = 0; i < a->n_expected; i++) {
        unsigned char v = value && i < len ? (unsigned char)value[i] : 0;
        unsigned char e = (unsigned char)a->expected[i];
        if (i < sizeof BEARER - 2) {
            v = (unsigned char)(((v >= 'A' && v <= 'Z') ? v | 0x20 : v));
            e = (unsigned char)(e | 0x20);
        }
        diff |= (unsigned)(v ^ e);
    }
    pthread_mutex_unlock(&a->mu);
    return diff == 0;
}

size_t rpc_auth_bearer(rpc_auth *a, char *buf)
{
    pthread_mutex_lock(&a->mu);
    maybe_reload(a);
    size_t n = a->n_expected;
    memcpy(buf, a->expected, n);
    pthread_mutex_unlock(&a->mu);
    return n;
}
