/* tokenizer_bench: encode and decode throughput of model/tokenizer on a large mixed text.
 *
 *   tokenizer_bench (--model F.gguf | --synth-vocab N) [--mb 8] [--chunk 4096] [--threads 2]
 *                   [--reps 3] [--dump-text PATH]
 *
 * --synth-vocab N builds the tokenizer from gguf/synth_vocab.h's deterministic byte-level BPE of
 * N tokens (248320: the real Qwen3.5 size, 248k merges), for the cost of a full-size vocabulary.
 *
 * The text: every regular file of /usr/share/common-licenses (English prose) interleaved with
 * multilingual snippets (accents, decomposed forms, CJK, emoji, code, ChatML specials), repeated
 * to --mb MiB. Figures (best of --reps):
 *   encode whole   one tokenizer_encode call over the whole text
 *   encode chunked --chunk-byte calls, as a server encodes prompts
 *   encode threads the chunked run split over --threads threads (aggregate MB/s)
 *   decode         tokenizer_decode of all the ids (MB/s of text produced)
 *   detok stream   tokenizer_detok_push per id (ns/token)
 * Single-thread figures are given per wall second and per CPU second of the thread (the latter
 * is steadier when other work shares the machine).
 * --dump-text writes the text so another tokenizer can be timed on the same bytes. */
#include <dirent.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/flags.h"
#include "gguf/synth_vocab.h"
#include "model/tokenizer.h"

typedef struct bench_opts {
    const char *model;
    int mb;
    int chunk;
    int threads;
    int reps;
    const char *dump_text;
    int synth_vocab;
} bench_opts;

static const flag_spec bench_flags[] = {
    {"model", "DS_MODEL", NULL, FLAG_STR, offsetof(bench_opts, model), "GGUF model file"},
    {"mb", NULL, "8", FLAG_INT, offsetof(bench_opts, mb), "text size in MiB"},
    {"chunk", NULL, "4096", FLAG_INT, offsetof(bench_opts, chunk), "bytes per chunked encode"},
    {"threads", NULL, "2", FLAG_INT, offsetof(bench_opts, threads), "threads for the threaded run"},
    {"reps", NULL, "3", FLAG_INT, offsetof(bench_opts, reps), "repetitions (best is kept)"},
    {"dump-text", NULL, NULL, FLAG_STR, offsetof(bench_opts, dump_text),
     "write the benchmark text to this file"},
    {"synth-vocab", NULL, "0", FLAG_INT, offsetof(bench_opts, synth_vocab),
     "instead of --model: a synthetic vocabulary of this many tokens"},
    {0},
};

static const char *const snippets[] = {
    "Café naïve résumé — déjà vu, façade, coöperate. ",
    "e\xCC\x81 versus \xC3\xA9, A\xCC\x8A and \xC3\x85. ",
    "日本語の文章はとても面白いです。今天天气很好，我们去公园吧。 ",
    "Привет, как дела? Ελληνικά γράμματα. مرحبا بالعالم. नमस्ते दुनिया। ",
    "🙂🚀 emoji 👨‍👩‍👧 and ✓ symbols ≤ ≥ ∑ ∫. ",
    "def f(x):\n    return x * 2  # doubled\n\nfor i in range(10):\n\tprint(f(i))\n",
    "<|im_start|>user\nHi there, what's 3.14159 * 2?<|im_end|>\n<|im_start|>assistant\n",
    "In 1987 the town had 4,512 residents; DON'T SHOUT, they've said it's theirs.   \n\n",
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* This thread's CPU time: on a shared, loaded machine it excludes time spent preempted, so the
 * single-thread figures are also given per CPU second. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Appends n bytes to the growing buffer. */
static void append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        *cap = 2 * (*len + n + 1);
        *buf = realloc(*buf, *cap);
        if (!*buf) {
            fprintf(stderr, "tokenizer_bench: out of memory\n");
            exit(1);
        }
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
}

/* Ends a chunk at a UTF-8 boundary at or before n. */
static size_t utf8_floor(const char *p, size_t n, size_t len)
{
    if (n >= len) return len;
    while (n > 0 && ((unsigned char)p[n] & 0xC0) == 0x80) n--;
    return n;
}

static char *build_text(size_t target, size_t *out_len)
{
    char *lic = NULL;
    size_t lic_len = 0, lic_cap = 0;
    DIR *d = opendir("/usr/share/common-licenses");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[512];
        struct stat sb;
        snprintf(path, sizeof path, "/usr/share/common-licenses/%s", e->d_name);
        if (lstat(path, &sb) || !S_ISREG(sb.st_mode)) continue;
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        char buf[65536];
        size_t r;
        while ((r = fread(buf, 1, sizeof buf, f)) > 0) append(&lic, &lic_len, &lic_cap, buf, r);
        fclose(f);
    }
    if (d) closedir(d);
    if (!lic_len) append(&lic, &lic_len, &lic_cap, "No license texts found here. ", 29);

    char *text = NULL;
    size_t len = 0, cap = 0, pos = 0;
    int k = 0;
    while (len < target) {
        size_t n = utf8_floor(lic + pos, 2048, lic_len - pos);
        append(&text, &len, &cap, lic + pos, n);
        pos = pos + n >= lic_len ? 0 : pos + n;
        const char *s = snippets[k++ % (sizeof snippets / sizeof *snippets)];
        append(&text, &len, &cap, s, strlen(s));
    }
    free(lic);
    *out_len = len;
    return text;
}

typedef struct work {
    const tokenizer *t;
    const char *text;
    size_t begin, end, chunk;
    size_t n_tokens;
    int failed;
} work;

static void *encode_chunks(void *arg)
{
    work *w = arg;
    w->n_tokens = 0;
    for (size_t p = w->begin; p < w->end;) {
        size_t n = utf8_floor(w->text + p, w->chunk, w->end - p);
        if (n == 0) n = w->end - p;
        int32_t *ids;
        size_t n_ids;
        status st = {0};
        if (tokenizer_encode(w->t, w->text + p, n, &ids, &n_ids, &st)) {
            fprintf(stderr, "encode: %s\n", st.msg);
            w->failed = 1;
            return NULL;
        }
        w->n_tokens += n_ids;
        free(ids);
        p += n;
    }
    return NULL;
}

/* Runs the chunked encode over n_threads threads; returns seconds, 0 on failure. */
static double run_chunked(const tokenizer *t, const char *text, size_t len, size_t chunk,
                          int n_threads, size_t *n_tokens)
{
    work w[64];
    pthread_t th[64];
    size_t per = len / (size_t)n_threads;
    size_t begin = 0;
    for (int i = 0; i < n_threads; i++) {
        size_t end = i == n_threads - 1 ? len : utf8_floor(text, begin + per, len);
        w[i] = (work){t, text, begin, end, chunk, 0, 0};
        begin = end;
    }
    double t0 = now_s();
    for (int i = 0; i < n_threads; i++) pthread_create(&th[i], NULL, encode_chunks, &w[i]);
    *n_tokens = 0;
    int failed = 0;
    for (int i = 0; i < n_threads; i++) {
        pthread_join(th[i], NULL);
        *n_tokens += w[i].n_tokens;
        failed |= w[i].failed;
    }
    return failed ? 0 : now_s() - t0;
}

/* A tokenizer over synth_vocab_build(n) (what `deltaserve gguf synth` writes). */
static int synth_tokenizer(tokenizer **t, int n, double *create_s, status *st)
{
    synth_vocab v;
    int rc = synth_vocab_build(&v, (uint32_t)n, st);
    if (rc) return rc;
    tokenizer_text *toks = malloc(v.n_tokens * sizeof *toks);
    tokenizer_text *merges = malloc((v.n_merges ? v.n_merges : 1) * sizeof *merges);
    if (!toks || !merges) {
        rc = status_fail(st, STATUS_NOMEM, "out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < v.n_tokens; i++) toks[i] = (tokenizer_text){v.tokens[i], strlen(v.tokens[i])};
    for (uint32_t i = 0; i < v.n_merges; i++)
        merges[i] = (tokenizer_text){v.merges[i], strlen(v.merges[i])};
    tokenizer_spec spec = {.n_tokens = v.n_tokens, .tokens = toks, .token_types = v.types,
                           .n_merges = v.n_merges, .merges = merges,
                           .eos_id = (int32_t)v.im_end_id, .bos_id = -1,
                           .pre = TOKENIZER_PRE_QWEN35};
    double t0 = now_s();
    rc = tokenizer_create(t, &spec, st);
    *create_s = now_s() - t0;
done:
    free(toks);
    free(merges);
    synth_vocab_free(&v);
    return rc;
}

int main(int argc, char **argv)
{
    bench_opts o = {0};
    status st = {0};
    int rc = flags_parse(bench_flags, &o, argc, argv, "tokenizer_bench --model F.gguf", &st);
    if (rc == STATUS_CANCELLED) return 0;
    if (rc || !o.model == !o.synth_vocab || o.mb < 1 || o.chunk < 16 || o.threads < 1 || o.threads > 64 ||
        o.reps < 1) {
        fprintf(stderr, "%s\nusage: tokenizer_bench (--model F.gguf | --synth-vocab N) [--mb N] [--chunk B] "
                        "[--threads T] [--reps R] [--dump-text PATH]\n", rc ? st.msg : "");
        return 2;
    }
    tokenizer *t;
    double t0 = now_s();
    double load_s = 0;
    if (o.model ? tokenizer_load_path(&t, o.model, &st)
                : synth_tokenizer(&t, o.synth_vocab, &load_s, &st)) {
        fprintf(stderr, "tokenizer_bench: %s\n", st.msg);
        return 1;
    }
    if (o.model) load_s = now_s() - t0; /* GGUF open + tokenizer_load; synthetic: create only */

    size_t len;
    char *text = build_text((size_t)o.mb << 20, &len);
    if (o.dump_text) {
        FILE *f = fopen(o.dump_text, "wb");
        if (!f || fwrite(text, 1, len, f) != len || fclose(f)) {
            fprintf(stderr, "tokenizer_bench: cannot write %s\n", o.dump_text);
            return 1;
        }
    }
    double mb = (double)len / 1e6;
    printf("%s: vocab %zu, load %.1f ms\n", o.model ? o.model : "synthetic vocabulary",
           tokenizer_n_vocab(t), 1e3 * load_s);

    int32_t *ids = NULL;
    size_t n_ids = 0;
    double best = 1e30, best_cpu = 1e30;
    for (int r = 0; r < o.reps; r++) {
        free(ids);
        t0 = now_s();
        double c0 = cpu_s();
        if (tokenizer_encode(t, text, len, &ids, &n_ids, &st)) {
            fprintf(stderr, "tokenizer_bench: %s\n", st.msg);
            return 1;
        }
        double s = now_s() - t0, c = cpu_s() - c0;
        if (s < best) best = s;
        if (c < best_cpu) best_cpu = c;
    }
    printf("text %.2f MB, %zu tokens (%.2f bytes/token)\n", mb, n_ids, (double)len / n_ids);
    printf("encode whole:    %7.2f MB/s  %9.0f tokens/s  (per CPU second: %.2f MB/s)\n",
           mb / best, n_ids / best, mb / best_cpu);

    size_t n_chunk_tokens = 0;
    int thread_counts[2] = {1, o.threads};
    for (int k = 0; k < (o.threads > 1 ? 2 : 1); k++) {
        int threads = thread_counts[k];
        best = 1e30;
        for (int r = 0; r < o.reps; r++) {
            double s = run_chunked(t, text, len, (size_t)o.chunk, threads, &n_chunk_tokens);
            if (s == 0) return 1;
            if (s < best) best = s;
        }
        printf("encode %5d-byte chunks, %d thread%s: %7.2f MB/s (%zu tokens)\n", o.chunk,
               threads, threads > 1 ? "s" : "", mb / best, n_chunk_tokens);
    }

    char *out = NULL;
    size_t out_len = 0;
    best = best_cpu = 1e30;
    for (int r = 0; r < o.reps; r++) {
        free(out);
        t0 = now_s();
        double c0 = cpu_s();
        if (tokenizer_decode(t, ids, n_ids, &out, &out_len, &st)) {
            fprintf(stderr, "tokenizer_bench: %s\n", st.msg);
            return 1;
        }
        double s = now_s() - t0, c = cpu_s() - c0;
        if (s < best) best = s;
        if (c < best_cpu) best_cpu = c;
    }
    printf("decode:          %7.2f MB/s  (per CPU second: %.2f MB/s; round trip %s)\n",
           out_len / 1e6 / best, out_len / 1e6 / best_cpu,
           out_len == len && !memcmp(out, text, len) ? "exact" : "differs: text not NFC");

    size_t cap = tokenizer_detok_max_out(t), w, total = 0;
    char *piece = malloc(cap);
    tokenizer_detok d;
    best = best_cpu = 1e30;
    for (int r = 0; r < o.reps; r++) {
        tokenizer_detok_init(&d, t);
        total = 0;
        t0 = now_s();
        double c0 = cpu_s();
        for (size_t i = 0; i < n_ids; i++) {
            tokenizer_detok_push(&d, ids[i], piece, cap, &w, &st);
            total += w;
        }
        total += tokenizer_detok_flush(&d, piece, cap);
        double s = now_s() - t0, c = cpu_s() - c0;
        if (s < best) best = s;
        if (c < best_cpu) best_cpu = c;
    }
    printf("detok stream:    %7.1f ns/token (per CPU: %.1f ns; %zu bytes out%s)\n",
           1e9 * best / n_ids, 1e9 * best_cpu / n_ids, total,
           total == out_len ? ", equals decode" : ", DIFFERS from decode");

    free(piece);
    free(out);
    free(ids);
    free(text);
    tokenizer_destroy(t);
    return 0;
}
