/* deltaserve gguf info FILE: architecture, hyperparameters, tokenizer summary, tensor table. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "gguf/gguf.h"
#include "gguf/quant.h"

#define INFO_MAX_ELEMS 8    /* array elements printed before "..." */
#define INFO_MAX_STR 64     /* string bytes printed before "..." */

/* llama_ftype names (llama.h), for general.file_type. */
static const char *ftype_name(uint32_t ft)
{
    static const char *const names[] = {
        [0] = "ALL_F32",   [1] = "MOSTLY_F16", [2] = "Q4_0",     [3] = "Q4_1",
        [7] = "Q8_0",      [8] = "Q5_0",       [9] = "Q5_1",     [10] = "Q2_K",
        [11] = "Q3_K_S",   [12] = "Q3_K_M",    [13] = "Q3_K_L",  [14] = "Q4_K_S",
        [15] = "Q4_K_M",   [16] = "Q5_K_S",    [17] = "Q5_K_M",  [18] = "Q6_K",
        [19] = "IQ2_XXS",  [20] = "IQ2_XS",    [21] = "Q2_K_S",  [22] = "IQ3_XS",
        [23] = "IQ3_XXS",  [24] = "IQ1_S",     [25] = "IQ4_NL",  [26] = "IQ3_S",
        [27] = "IQ3_M",    [28] = "IQ2_S",     [29] = "IQ2_M",   [30] = "IQ4_XS",
        [31] = "IQ1_M",    [32] = "BF16",      [36] = "TQ1_0",   [37] = "TQ2_0",
        [38] = "MXFP4_MOE",
    };
    return ft < sizeof names / sizeof names[0] && names[ft] ? names[ft] : "unknown";
}

/* Prints s quoted, escaping control bytes and quotes, truncated at INFO_MAX_STR bytes. */
static void print_str(FILE *o, gguf_str s)
{
    uint64_t n = s.len < INFO_MAX_STR ? s.len : INFO_MAX_STR;
    fputc('"', o);
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '"' || c == '\\')
            fprintf(o, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", o);
        else if (c < 0x20 || c == 0x7f)
            fprintf(o, "\\x%02x", c);
        else
            fputc(c, o);
    }
    fputc('"', o);
    if (s.len > n) fprintf(o, "...(%" PRIu64 " bytes)", s.len);
}

/* Shortest %g form that reads back as the same float (or double). */
static void print_float(FILE *o, double d, bool is_f32)
{
    char buf[40];
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, d);
        if (is_f32 ? strtof(buf, NULL) == (float)d : strtod(buf, NULL) == d) break;
    }
    fputs(buf, o);
}

/* Prints element i of kv (a scalar is element 0). */
static void print_elem(FILE *o, const gguf_kv *kv, uint64_t i)
{
    gguf_vtype t = kv->type == GGUF_VTYPE_ARRAY ? kv->arr_type : kv->type;
    int64_t v;
    double d;
    if (t == GGUF_VTYPE_STRING)
        print_str(o, kv->strs[i]);
    else if (t == GGUF_VTYPE_BOOL)
        fputs(kv->data[i] ? "true" : "false", o);
    else if (t == GGUF_VTYPE_UINT64) {
        uint64_t u;
        memcpy(&u, kv->data + 8 * i, 8);
        fprintf(o, "%" PRIu64, u);
    } else if (gguf_kv_get_int(kv, i, &v) == STATUS_OK)
        fprintf(o, "%" PRId64, v);
    else if (gguf_kv_get_float(kv, i, &d) == STATUS_OK)
        print_float(o, d, t == GGUF_VTYPE_FLOAT32);
    else
        fputs("?", o);
}

static void print_value(FILE *o, const gguf_kv *kv)
{
    if (kv->type != GGUF_VTYPE_ARRAY) {
        print_elem(o, kv, 0);
        return;
    }
    fputc('[', o);
    for (uint64_t i = 0; i < kv->n && i < INFO_MAX_ELEMS; i++) {
        if (i) fputs(", ", o);
        print_elem(o, kv, i);
    }
    if (kv->n > INFO_MAX_ELEMS) fputs(", ...", o);
    fprintf(o, "] (%" PRIu64 " x %s)", kv->n, gguf_vtype_name(kv->arr_type));
}

static bool key_has_prefix(const gguf_kv *kv, const char *prefix)
{
    size_t n = strlen(prefix);
    return kv->key.len > n && memcmp(kv->key.ptr, prefix, n) == 0;
}

static void print_kv_line(FILE *o, const gguf_kv *kv)
{
    fprintf(o, "  %.*s = ", (int)kv->key.len, kv->key.ptr);
    print_value(o, kv);
    fputc('\n', o);
}

/* "name: value" for an optional scalar key, or "-" when absent. */
static void print_opt(FILE *o, const gguf_file *f, const char *label, const char *key)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    fprintf(o, "  %-14s ", label);
    if (kv)
        print_value(o, kv);
    else
        fputc('-', o);
    fputc('\n', o);
}

static void print_tokenizer(FILE *o, const gguf_file *f)
{
    const gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    const gguf_kv *merges = gguf_find_kv(f, "tokenizer.ggml.merges");
    const gguf_kv *tmpl = gguf_find_kv(f, "tokenizer.chat_template");
    fprintf(o, "tokenizer:\n");
    print_opt(o, f, "model", "tokenizer.ggml.model");
    print_opt(o, f, "pre", "tokenizer.ggml.pre");
    fprintf(o, "  %-14s %" PRIu64 "\n", "vocab size",
            tokens && tokens->type == GGUF_VTYPE_ARRAY ? tokens->n : 0);
    fprintf(o, "  %-14s %" PRIu64 "\n", "merges",
            merges && merges->type == GGUF_VTYPE_ARRAY ? merges->n : 0);
    print_opt(o, f, "eos id", "tokenizer.ggml.eos_token_id");
    print_opt(o, f, "bos id", "tokenizer.ggml.bos_token_id");
    print_opt(o, f, "pad id", "tokenizer.ggml.padding_token_id");
    print_opt(o, f, "add bos", "tokenizer.ggml.add_bos_token");
    if (tmpl && tmpl->type == GGUF_VTYPE_STRING)
        fprintf(o, "  %-14s yes (%" PRIu64 " bytes)\n", "chat template", tmpl->strs[0].len);
    else
        fprintf(o, "  %-14s no\n", "chat template");
}

static void print_tensors(FILE *o, const gguf_file *f)
{
    uint64_t total = 0, count_by_type[GGML_TYPE_MAX_ID + 1] = {0};
    uint64_t bytes_by_type[GGML_TYPE_MAX_ID + 1] = {0};
    int w = 4;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if ((int)f->tensors[i].name.len > w) w = (int)f->tensors[i].name.len;
    if (w > 64) w = 64;

    fprintf(o, "tensors:\n  %-*s %-6s %-28s %14s\n", w, "name", "type", "shape (ne)", "bytes");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const quant_traits *qt = quant_get(t->type);
        char shape[128];
        int n = snprintf(shape, sizeof shape, "[");
        for (uint32_t d = 0; d < t->n_dims; d++)
            n += snprintf(shape + n, sizeof shape - (size_t)n, "%s%" PRIu64, d ? ", " : "", t->ne[d]);
        snprintf(shape + n, sizeof shape - (size_t)n, "]");
        fprintf(o, "  %-*.*s %-6s %-28s %14" PRIu64 "\n", w, (int)t->name.len, t->name.ptr,
                qt ? qt->name : "?", shape, t->n_bytes);
        total += t->n_bytes;
        if (t->type <= GGML_TYPE_MAX_ID) {
            count_by_type[t->type]++;
            bytes_by_type[t->type] += t->n_bytes;
        }
    }
    fprintf(o, "totals: %" PRIu64 " tensors, %" PRIu64 " bytes (%.2f MiB)\n", f->n_tensors, total,
            (double)total / (1024.0 * 1024.0));
    for (uint32_t ty = 0; ty <= GGML_TYPE_MAX_ID; ty++)
        if (count_by_type[ty])
            fprintf(o, "  %-6s %6" PRIu64 " tensors %14" PRIu64 " bytes\n", quant_get(ty)->name,
                    count_by_type[ty], bytes_by_type[ty]);
}

/* "mtp:" summary when <arch>.nextn_predict_layers > 0: the MTP (nextn) layers are the last
 * blocks (docs/QWEN35.md §1.4); their tensors are counted from the first one's index on. */
static void print_mtp(FILE *o, const gguf_file *f, const char *prefix)
{
    char key[128];
    uint32_t nextn = 0, blocks = 0;
    status st;
    snprintf(key, sizeof key, "%snextn_predict_layers", prefix);
    if (gguf_get_u32(f, key, &nextn, &st) != STATUS_OK || nextn == 0) {
        fprintf(o, "mtp: none\n");
        return;
    }
    snprintf(key, sizeof key, "%sblock_count", prefix);
    if (gguf_get_u32(f, key, &blocks, &st) != STATUS_OK || blocks <= nextn) {
        fprintf(o, "mtp: %u nextn layer(s) but block_count %u does not hold them\n", nextn, blocks);
        return;
    }
    uint64_t n = 0, bytes = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        unsigned blk;
        char rest;
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)(t->name.len < 95 ? t->name.len : 95), t->name.ptr);
        if (sscanf(name, "blk.%u.%c", &blk, &rest) == 2 && blk >= blocks - nextn) {
            n++;
            bytes += t->n_bytes;
        }
    }
    fprintf(o, "mtp: %u nextn layer(s) from blk.%u: %" PRIu64 " tensors, %" PRIu64 " bytes\n", nextn,
            blocks - nextn, n, bytes);
}

static void print_info(FILE *o, const gguf_file *f)
{
    status st;
    gguf_str arch = {0, ""}, name = {0, ""};
    bool has_arch = gguf_get_str(f, "general.architecture", &arch, &st) == STATUS_OK;
    bool has_name = gguf_get_str(f, "general.name", &name, &st) == STATUS_OK;
    uint32_t ft = 0;
    bool has_ft = gguf_get_u32(f, "general.file_type", &ft, &st) == STATUS_OK;

    fprintf(o, "file: %s (%" PRIu64 " bytes, GGUF v%u, %" PRIu64 " KVs, alignment %" PRIu64
               ", data at %" PRIu64 ")\n",
            f->path, f->size, f->version, f->n_kv, f->alignment, f->data_offset);
    fprintf(o, "architecture: %.*s\n", has_arch ? (int)arch.len : 1, has_arch ? arch.ptr : "-");
    fprintf(o, "name: %.*s\n", has_name ? (int)name.len : 1, has_name ? name.ptr : "-");
    if (has_ft)
        fprintf(o, "file_type: %u (%s)\n", ft, ftype_name(ft));
    else
        fprintf(o, "file_type: -\n");

    /* <arch>.* keys, in file order */
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%.*s.", has_arch ? (int)(arch.len < 70 ? arch.len : 70) : 0,
             arch.ptr);
    fprintf(o, "hyperparameters:\n");
    for (uint64_t i = 0; has_arch && i < f->n_kv; i++)
        if (key_has_prefix(&f->kv[i], prefix)) print_kv_line(o, &f->kv[i]);
    if (has_arch) print_mtp(o, f, prefix);

    print_tokenizer(o, f);

    fprintf(o, "other metadata:\n");
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        if ((has_arch && key_has_prefix(kv, prefix)) || key_has_prefix(kv, "tokenizer.") ||
            gguf_str_eq(kv->key, "general.architecture") || gguf_str_eq(kv->key, "general.name") ||
            gguf_str_eq(kv->key, "general.file_type"))
            continue;
        print_kv_line(o, kv);
    }
    print_tensors(o, f);
}

int cmd_gguf_info(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: deltaserve gguf info FILE\n"
               "Prints a GGUF file's architecture, hyperparameters, tokenizer summary and "
               "tensor table.\n");
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: deltaserve gguf info FILE\n");
        return 2;
    }
    gguf_file *f;
    status st;
    status_clear(&st);
    if (gguf_open(&f, argv[1], &st) != STATUS_OK) {
        /* the reader's messages start with the path already */
        const char *msg = st.msg;
        size_t n = strlen(argv[1]);
        if (!strncmp(msg, argv[1], n) && !strncmp(msg + n, ": ", 2)) msg += n + 2;
        fprintf(stderr, "deltaserve gguf info: %s: %s\n", argv[1], msg);
        return 1;
    }
    print_info(stdout, f);
    gguf_close(f);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "deltaserve gguf info: %s: writing output failed\n", argv[1]);
        return 1;
    }
    return 0;
}
