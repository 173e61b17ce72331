#include "rpc/rpc_reflection.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/grpc/reflection/v1alpha/reflection.pb-c.h"

#define REFL_MAX_FILES 32
#define REFL_MAX_DEPS 16
#define REFL_MAX_SERVICES 16
#define REFL_NAME_MAX 256

typedef struct refl_file {
    const uint8_t *data; /* the FileDescriptorProto bytes: borrowed from the set, or owned */
    size_t bytes;
    uint8_t *owned;      /* owned, [bytes]: the file without the services not served, or NULL */
    char name[REFL_NAME_MAX];
    char package[REFL_NAME_MAX];
    char deps[REFL_MAX_DEPS][REFL_NAME_MAX];
    int n_deps;
} refl_file;

typedef struct refl_symbol {
    char *name; /* owned, fully qualified */
    int file;
} refl_symbol;

struct rpc_reflection {
    refl_file files[REFL_MAX_FILES];
    int n_files;
    refl_symbol *symbols; /* owned, [n_symbols] */
    int n_symbols, cap_symbols;
    char services[REFL_MAX_SERVICES][REFL_NAME_MAX];
    int n_services;
};

/* ---- a minimal protobuf wire reader: enough for descriptor.proto's few fields ---- */

typedef struct wire {
    const uint8_t *p, *end;
} wire;

static bool wire_varint(wire *w, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && w->p < w->end; shift += 7) {
        uint8_t b = *w->p++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return true;
    }
    return false;
}

/* Next field: number, wire type, and for length-delimited fields the payload. Skips the value
 * of other wire types. Returns 0 at the end, -1 on malformed input, 1 otherwise. */
static int wire_next(wire *w, uint32_t *field, const uint8_t **data, size_t *len)
{
    uint64_t key, v;
    if (w->p == w->end) return 0;
    if (!wire_varint(w, &key)) return -1;
    *field = (uint32_t)(key >> 3);
    *data = NULL;
    *len = 0;
    switch (key & 7) {
    case 0: return wire_varint(w, &v) ? 1 : -1;
    case 1: if (w->end - w->p < 8) return -1; w->p += 8; return 1;
    case 5: if (w->end - w->p < 4) return -1; w->p += 4; return 1;
    case 2:
        if (!wire_varint(w, &v) || v > (uint64_t)(w->end - w->p)) return -1;
        *data = w->p;
        *len = (size_t)v;
        w->p += v;
        return 1;
    default: return -1;
    }
}

static bool copy_name(char *dst, const uint8_t *src, size_t n)
{
    if (!src || n >= REFL_NAME_MAX) return false;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return true;
}

static int add_symbol(rpc_reflection *r, const char *scope, const uint8_t *name, size_t n,
                      int file, char *out, status *st)
{
    char leaf[REFL_NAME_MAX];
    if (!copy_name(leaf, name, n)) return status_fail(st, STATUS_FORMAT, "reflection: bad name");
    int k = snprintf(out, REFL_NAME_MAX, "%s%s%s", scope, scope[0] ? "." : "", leaf);
    if (k < 0 || k >= REFL_NAME_MAX)
        return status_fail(st, STATUS_FORMAT, "reflection: symbol name too long in %s",
                           r->files[file].name);
    if (r->n_symbols == r->cap_symbols) {
        int cap = r->cap_symbols ? r->cap_symbols * 2 : 64;
        refl_symbol *s = realloc(r->symbols, (size_t)cap * sizeof *s);
        if (!s) return status_fail(st, STATUS_NOMEM, "reflection: out of memory");
        r->symbols = s;
        r->cap_symbols = cap;
    }
    r->symbols[r->n_symbols].name = strdup(out);
    if (!r->symbols[r->n_symbols].name) return status_fail(st, STATUS_NOMEM, "reflection: oom");
    r->symbols[r->n_symbols++].file = file;
    return STATUS_OK;
}

/* The name (field 1) of a DescriptorProto / EnumDescriptorProto / ServiceDescriptorProto /
 * MethodDescriptorProto. */
static bool field1_name(const uint8_t *data, size_t len, const uint8_t **name, size_t *n)
{
    wire w = {data, data + len};
    uint32_t f;
    const uint8_t *d;
    size_t l;
    int rc;
    while ((rc = wire_next(&w, &f, &d, &l)) > 0)
        if (f == 1 && d) {
            *name = d;
            *n = l;
            return true;
        }
    return false;
}

/* kind: 4 message (nested messages field 3, nested enums field 4), 5 enum, 6 service (methods
 * field 2). Adds the symbol and its children. */
static int index_decl(rpc_reflection *r, int file, const char *scope, int kind,
                      const uint8_t *data, size_t len, int depth, status *st)
{
    const uint8_t *nm;
    size_t nn;
    char full[REFL_NAME_MAX];
    if (depth > 32 || !field1_name(data, len, &nm, &nn))
        return status_fail(st, STATUS_FORMAT, "reflection: unnamed or too deep declaration in %s",
                           r->files[file].name);
    if (add_symbol(r, scope, nm, nn, file, full, st)) return st->code;
    if (kind == 5) return STATUS_OK;
    wire w = {data, data + len};
    uint32_t f;
    const uint8_t *d;
    size_t l;
    int rc;
    while ((rc = wire_next(&w, &f, &d, &l)) > 0) {
        if (!d) continue;
        if (kind == 4 && (f == 3 || f == 4)) {
            if (index_decl(r, file, full, f == 3 ? 4 : 5, d, l, depth + 1, st)) return st->code;
        } else if (kind == 6 && f == 2) {
            char tmp[REFL_NAME_MAX];
            if (!field1_name(d, l, &nm, &nn))
                return status_fail(st, STATUS_FORMAT, "reflection: unnamed method");
            if (add_symbol(r, full, nm, nn, file, tmp, st)) return st->code;
        }
    }
    return rc < 0 ? status_fail(st, STATUS_FORMAT, "reflection: malformed declaration in %s",
                                r->files[file].name)
                  : STATUS_OK;
}

static bool served(const rpc_reflection *r, const char *full)
{
    for (int i = 0; i < r->n_services; i++)
        if (strcmp(r->services[i], full) == 0) return true;
    return false;
}

/* Whether a ServiceDescriptorProto of file f is one this server serves. */
static bool service_served(const rpc_reflection *r, const refl_file *f, const uint8_t *d,
                           size_t l)
{
    const uint8_t *nm;
    size_t nn;
    char leaf[REFL_NAME_MAX], full[2 * REFL_NAME_MAX + 2];
    if (!field1_name(d, l, &nm, &nn) || !copy_name(leaf, nm, nn)) return true; /* index_decl
                                                                                  refuses it */
    snprintf(full, sizeof full, "%s%s%s", f->package, f->package[0] ? "." : "", leaf);
    return served(r, full);
}

/* The file's bytes less the services (field 6) this server does not serve, so that reflection
 * describes only what it serves. */
static int drop_services(rpc_reflection *r, refl_file *f, status *st)
{
    uint8_t *out = malloc(f->bytes ? f->bytes : 1);
    if (!out) return status_fail(st, STATUS_NOMEM, "reflection: out of memory");
    size_t n = 0;
    wire w = {f->data, f->data + f->bytes};
    uint32_t num;
    const uint8_t *d;
    size_t l;
    for (const uint8_t *start = w.p; wire_next(&w, &num, &d, &l) > 0; start = w.p) {
        if (num == 6 && d && !service_served(r, f, d, l)) continue;
        memcpy(out + n, start, (size_t)(w.p - start));
        n += (size_t)(w.p - start);
    }
    f->owned = out;
    f->data = out;
    f->bytes = n;
    return STATUS_OK;
}

static int index_file(rpc_reflection *r, int fi, status *st)
{
    refl_file *f = &r->files[fi];
    wire w = {f->data, f->data + f->bytes};
    uint32_t num;
    const uint8_t *d;
    size_t l;
    int rc;
    /* first pass: name, package, dependencies (the package scopes the declarations) */
    while ((rc = wire_next(&w, &num, &d, &l)) > 0) {
        if (!d) continue;
        bool ok = true;
        if (num == 1) ok = copy_name(f->name, d, l);
        else if (num == 2) ok = copy_name(f->package, d, l);
        else if (num == 3) ok = f->n_deps < REFL_MAX_DEPS && copy_name(f->deps[f->n_deps++], d, l);
        if (!ok) return status_fail(st, STATUS_FORMAT, "reflection: file %d: bad name field", fi);
    }
    if (rc < 0 || !f->name[0])
        return status_fail(st, STATUS_FORMAT, "reflection: file %d: malformed FileDescriptorProto", fi);
    w = (wire){f->data, f->data + f->bytes};
    bool dropped = false;
    while ((rc = wire_next(&w, &num, &d, &l)) > 0) {
        if (d && num == 6 && !service_served(r, f, d, l)) {
            dropped = true;
            continue;
        }
        if (d && (num == 4 || num == 5 || num == 6))
            if (index_decl(r, fi, f->package, (int)num, d, l, 0, st)) return st->code;
    }
    return dropped ? drop_services(r, f, st) : STATUS_OK;
}

int rpc_reflection_create(const uint8_t *fds, size_t fds_bytes, const char *const *services,
                          int n_services, rpc_reflection **out, status *st)
{
    *out = NULL;
    if (n_services > REFL_MAX_SERVICES)
        return status_fail(st, STATUS_INVALID, "reflection: more than %d services", REFL_MAX_SERVICES);
    rpc_reflection *r = calloc(1, sizeof *r);
    if (!r) return status_fail(st, STATUS_NOMEM, "reflection: out of memory");
    for (int i = 0; i < n_services; i++) {
        DS_ASSERT(strlen(services[i]) < REFL_NAME_MAX);
        strcpy(r->services[r->n_services++], services[i]);
    }
    wire w = {fds, fds + fds_bytes};
    uint32_t num;
    const uint8_t *d;
    size_t l;
    int rc;
    while ((rc = wire_next(&w, &num, &d, &l)) > 0) {
        if (num != 1 || !d) continue;
        if (r->n_files == REFL_MAX_FILES) {
            status_fail(st, STATUS_FORMAT, "reflection: more than %d files", REFL_MAX_FILES);
            goto fail;
        }
        r->files[r->n_files].data = d;
        r->files[r->n_files].bytes = l;
        if (index_file(r, r->n_files++, st)) goto fail;
    }
    if (rc < 0 || r->n_files == 0) {
        status_fail(st, STATUS_FORMAT, "reflection: malformed or empty FileDescriptorSet (%zu bytes)",
                    fds_bytes);
        goto fail;
    }
    *out = r;
    return STATUS_OK;
fail:
    rpc_reflection_destroy(r);
    return st ? st->code : STATUS_FORMAT;
}

void rpc_reflection_destroy(rpc_reflection *r)
{
    if (!r) return;
    for (int i = 0; i < r->n_files; i++) free(r->files[i].owned);
    for (int i = 0; i < r->n_symbols; i++) free(r->symbols[i].name);
    free(r->symbols);
    free(r);
}

int rpc_reflection_n_files(const rpc_reflection *r) { return r->n_files; }
const char *rpc_reflection_file_name(const rpc_reflection *r, int i) { return r->files[i].name; }

int rpc_reflection_find_file(const rpc_reflection *r, const char *name)
{
    for (int i = 0; i < r->n_files; i++)
        if (strcmp(r->files[i].name, name) == 0) return i;
    return -1;
}

int rpc_reflection_find_symbol(const rpc_reflection *r, const char *symbol)
{
    if (symbol[0] == '.') symbol++; /* accept ".pkg.Type" too */
    for (int i = 0; i < r->n_symbols; i++)
        if (strcmp(r->symbols[i].name, symbol) == 0) return r->symbols[i].file;
    return -1;
}

int rpc_reflection_closure(const rpc_reflection *r, int i, int *out, int cap)
{
    int n = 0;
    if (cap < 1) return 0;
    out[n++] = i;
    for (int k = 0; k < n; k++) { /* breadth first over out[] itself */
        const refl_file *f = &r->files[out[k]];
        for (int d = 0; d < f->n_deps; d++) {
            int j = rpc_reflection_find_file(r, f->deps[d]);
            bool seen = j < 0;
            for (int m = 0; m < n && !seen; m++) seen = out[m] == j;
            if (!seen && n < cap) out[n++] = j;
        }
    }
    return n;
}

/* ---- the ServerReflectionInfo handler (bidi: one response per request) ---- */

typedef Grpc__Reflection__V1alpha__ServerReflectionRequest refl_req;
typedef Grpc__Reflection__V1alpha__ServerReflectionResponse refl_resp;

static void reply_error(rpc_call *call, refl_resp *resp, int code, const char *msg)
{
    Grpc__Reflection__V1alpha__ErrorResponse err = GRPC__REFLECTION__V1ALPHA__ERROR_RESPONSE__INIT;
    err.error_code = code;
    err.error_message = (char *)msg;
    resp->message_response_case =
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
    resp->error_response = &err;
    rpc_call_send(call, &resp->base);
}

static void reply_file(rpc_call *call, const rpc_reflection *r, refl_resp *resp, int fi)
{
    int idx[REFL_MAX_FILES];
    ProtobufCBinaryData blobs[REFL_MAX_FILES];
    int n = rpc_reflection_closure(r, fi, idx, REFL_MAX_FILES);
    for (int k = 0; k < n; k++)
        blobs[k] = (ProtobufCBinaryData){r->files[idx[k]].bytes, (uint8_t *)r->files[idx[k]].data};
    Grpc__Reflection__V1alpha__FileDescriptorResponse fdr =
        GRPC__REFLECTION__V1ALPHA__FILE_DESCRIPTOR_RESPONSE__INIT;
    fdr.n_file_descriptor_proto = (size_t)n;
    fdr.file_descriptor_proto = blobs;
    resp->message_response_case =
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
    resp->file_descriptor_response = &fdr;
    rpc_call_send(call, &resp->base);
}

static void reply_services(rpc_call *call, const rpc_reflection *r, refl_resp *resp)
{
    Grpc__Reflection__V1alpha__ServiceResponse svc[REFL_MAX_SERVICES];
    Grpc__Reflection__V1alpha__ServiceResponse *ptrs[REFL_MAX_SERVICES];
    for (int i = 0; i < r->n_services; i++) {
        svc[i] = (Grpc__Reflection__V1alpha__ServiceResponse)GRPC__REFLECTION__V1ALPHA__SERVICE_RESPONSE__INIT;
        svc[i].name = (char *)r->services[i];
        ptrs[i] = &svc[i];
    }
    Grpc__Reflection__V1alpha__ListServiceResponse ls = GRPC__REFLECTION__V1ALPHA__LIST_SERVICE_RESPONSE__INIT;
    ls.n_service = (size_t)r->n_services;
    ls.service = ptrs;
    resp->message_response_case =
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
    resp->list_services_response = &ls;
    rpc_call_send(call, &resp->base);
}

/* The file (and its dependencies) for a lookup result fi, or a NOT_FOUND error response. */
static void reply_lookup(rpc_call *call, const rpc_reflection *r, refl_resp *resp, int fi,
                         const char *what, const char *name)
{
    if (fi >= 0) {
        reply_file(call, r, resp, fi);
        return;
    }
    char m[REFL_NAME_MAX + 64];
    snprintf(m, sizeof m, "%s not found: %.256s", what, name);
    reply_error(call, resp, GRPC_STATUS_NOT_FOUND, m);
}

static void on_info(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    const rpc_reflection *r = user;
    if (!msg) { /* the client half-closed: done */
        rpc_call_finish(call, GRPC_STATUS_OK, NULL);
        return;
    }
    const refl_req *req = (const refl_req *)msg;
    refl_resp resp = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__INIT;
    resp.valid_host = req->host;
    resp.original_request = (refl_req *)req;
    switch (req->message_request_case) {
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
        reply_services(call, r, &resp);
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
        reply_lookup(call, r, &resp, rpc_reflection_find_file(r, req->file_by_filename), "file",
                     req->file_by_filename);
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
        reply_lookup(call, r, &resp, rpc_reflection_find_symbol(r, req->file_containing_symbol),
                     "symbol", req->file_containing_symbol);
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
        reply_error(call, &resp, GRPC_STATUS_NOT_FOUND, "no extensions");
        break;
    default:
        reply_error(call, &resp, GRPC_STATUS_UNIMPLEMENTED, "not implemented");
        break;
    }
}

static void on_info_cancel(rpc_call *call, void *user)
{
    (void)user;
    rpc_call_finish(call, GRPC_STATUS_CANCELLED, "cancelled");
}

int rpc_reflection_add_methods(rpc_reflection *r, rpc_server *srv, status *st)
{
    static const char *paths[] = {
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    };
    for (int i = 0; i < 2; i++) {
        const rpc_method m = {paths[i], &grpc__reflection__v1alpha__server_reflection_request__descriptor,
                              RPC_METHOD_BIDI_STREAM, on_info, on_info_cancel, NULL, r,
                              .end_at_shutdown = true};
        if (rpc_server_add_method(srv, &m, st)) return st->code;
    }
    return STATUS_OK;
}
