/* synth_write: metadata, tokenizer and tensor table through the streaming GGUF writer, then
 * the tensor data by a pool of threads, each taking the next chunk of rows (one work list
 * over all tensors), generating it into its own buffer and pwriting it into place. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "gguf/gguf_writer.h"
#include "gguf/synth.h"
#include "gguf/synth_vocab.h"

#define DEFAULT_CHUNK_BYTES (4u << 20)
#define MAX_THREADS 512

typedef struct work_item {
    int tensor;    /* index into the plan (and the writer) */
    uint64_t row0; /* first row */
    uint64_t n_rows;
} work_item;

typedef struct work {
    const synth_tensor *tensors; /* [n_tensors], the plan */
    const uint64_t *keys;        /* [n_tensors] RNG keys */
    gguf_writer *w;
    const work_item *items; /* [n_items] */
    uint64_t n_items;
    uint64_t buf_bytes; /* largest item */
    atomic_uint_fast64_t next;
    atomic_int failed;
    pthread_mutex_t lock; /* guards st */
    status st;            /* first failure */
} work;


static void work_fail(work *wk, const status *st)
{
    pthread_mutex_lock(&wk->lock);
    if (!atomic_load(&wk->failed)) wk->st = *st;
    atomic_store(&wk->failed, 1);
    pthread_mutex_unlock(&wk->lock);
}

static void *work_thread(void *arg)
{
    work *wk = arg;
    status st;
    status_clear(&st);
    void *buf = malloc(wk->buf_bytes);
    if (!buf) {
        status_fail(&st, STATUS_NOMEM, "synth: out of memory for a %llu-byte chunk buffer",
                    (unsigned long long)wk->buf_bytes);
        work_fail(wk, &st);
        return NULL;
    }
    for (;;) {
        if (atomic_load(&wk->failed)) break;
        uint64_t i = atomic_fetch_add(&wk->next, 1);
        if (i >= wk->n_items) break;
        const work_item *it = &wk->items[i];
        const synth_tensor *t = &wk->tensors[it->tensor];
        uint64_t n = it->n_rows * t->row_bytes;
        synth_fill_rows(t, wk->keys[it->tensor], it->row0, it->n_rows, buf);
        uint64_t off = gguf_writer_tensor_offset(wk->w, it->tensor) + it->row0 * t->row_bytes;
        if (gguf_writer_pwrite(wk->w, buf, n, off, &st)) {
            work_fail(wk, &st);
            break;
        }
    }
    free(buf);
    return NULL;
}

/* Splits every tensor into chunks of about chunk_bytes (whole rows). */
static int make_items(const synth_tensor *t, int n_t, uint64_t chunk_bytes, work_item **out,
                      uint64_t *n_out, uint64_t *buf_bytes, status *st)
{
    uint64_t n = 0, cap = 0;
    for (int i = 0; i < n_t; i++) {
        uint64_t rpc = chunk_bytes / t[i].row_bytes ? chunk_bytes / t[i].row_bytes : 1;
        cap += (t[i].ne[1] + rpc - 1) / rpc;
    }
    work_item *items = malloc(sizeof *items * (cap ? cap : 1));
    if (!items) return status_fail(st, STATUS_NOMEM, "synth: out of memory for work items");
    *buf_bytes = 1;
    for (int i = 0; i < n_t; i++) {
        uint64_t rpc = chunk_bytes / t[i].row_bytes ? chunk_bytes / t[i].row_bytes : 1;
        for (uint64_t r = 0; r < t[i].ne[1]; r += rpc) {
            uint64_t nr = t[i].ne[1] - r < rpc ? t[i].ne[1] - r : rpc;
            items[n++] = (work_item){.tensor = i, .row0 = r, .n_rows = nr};
            if (nr * t[i].row_bytes > *buf_bytes) *buf_bytes = nr * t[i].row_bytes;
        }
    }
    DS_ASSERT(n == cap);
    *out = items;
    *n_out = n;
    return 0;
}

/* Every metadata key of docs/QWEN35.md §1.2 and the tokenizer of §1.6. A setter's failure is kept
 * by the writer and reported, with its message, by gguf_writer_begin_data. */
static void set_metadata(gguf_writer *w, const synth_preset *p, synth_quant q, uint64_t seed,
                         bool mtp, synth_template tmpl, const synth_vocab *v)
{
    char name[96];
    snprintf(name, sizeof name, "deltaserve synth qwen35 %s %s", p->name, synth_quant_name(q));
    int32_t sections[4] = {p->rope_sections[0], p->rope_sections[1], p->rope_sections[2],
                           p->rope_sections[3]};
    gguf_writer_set_str(w, "general.architecture", "qwen35");
    gguf_writer_set_str(w, "general.name", name);
    gguf_writer_set_u32(w, "general.file_type", synth_quant_file_type(q));
    gguf_writer_set_u32(w, "general.quantization_version", 2);
    gguf_writer_set_str(w, "deltaserve.synth.preset", p->name);
    gguf_writer_set_u64(w, "deltaserve.synth.seed", seed);
    gguf_writer_set_u32(w, "qwen35.context_length", p->n_ctx_train);
    gguf_writer_set_u32(w, "qwen35.embedding_length", (uint32_t)p->H);
    gguf_writer_set_u32(w, "qwen35.block_count", (uint32_t)p->n_layer + (mtp ? 1 : 0));
    if (mtp) gguf_writer_set_u32(w, "qwen35.nextn_predict_layers", 1);
    gguf_writer_set_u32(w, "qwen35.feed_forward_length", (uint32_t)p->F);
    gguf_writer_set_u32(w, "qwen35.attention.head_count", (uint32_t)p->n_h);
    gguf_writer_set_u32(w, "qwen35.attention.head_count_kv", (uint32_t)p->n_kv);
    gguf_writer_set_u32(w, "qwen35.attention.key_length", (uint32_t)p->d_h);
    gguf_writer_set_u32(w, "qwen35.attention.value_length", (uint32_t)p->d_h);
    gguf_writer_set_f32(w, "qwen35.attention.layer_norm_rms_epsilon", p->eps);
    gguf_writer_set_f32(w, "qwen35.rope.freq_base", p->rope_base);
    gguf_writer_set_u32(w, "qwen35.rope.dimension_count", (uint32_t)p->n_rot);
    gguf_writer_set_arr(w, "qwen35.rope.dimension_sections", GGUF_VTYPE_INT32, sections, 4);
    gguf_writer_set_u32(w, "qwen35.ssm.conv_kernel", (uint32_t)p->K_conv);
    gguf_writer_set_u32(w, "qwen35.ssm.state_size", (uint32_t)p->d_k);
    gguf_writer_set_u32(w, "qwen35.ssm.group_count", (uint32_t)p->n_k);
    gguf_writer_set_u32(w, "qwen35.ssm.time_step_rank", (uint32_t)p->n_v);
    gguf_writer_set_u32(w, "qwen35.ssm.inner_size", (uint32_t)(p->n_v * p->d_v));
    gguf_writer_set_u32(w, "qwen35.full_attention_interval", (uint32_t)p->full_attn_interval);
    gguf_writer_set_u32(w, "qwen35.vocab_size", (uint32_t)p->V);
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen35");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v->tokens, v->n_tokens);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VTYPE_INT32, v->types,
                        v->n_tokens);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", v->merges, v->n_merges);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", v->im_end_id);
    gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", v->endoftext_id);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", v->endoftext_id);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    gguf_writer_set_str(w, "tokenizer.chat_template", synth_vocab_chat_template(tmpl));
}

static int run_threads(work *wk, int n_threads, status *st)
{
    pthread_t tid[MAX_THREADS];
    int started = 0;
    for (; started < n_threads; started++)
        if (pthread_create(&tid[started], NULL, work_thread, wk)) break;
    if (started == 0) work_thread(wk); /* no thread could start: do it here */
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    if (atomic_load(&wk->failed)) {
        *st = wk->st;
        return st->code ? (int)st->code : STATUS_INTERNAL;
    }
    return 0;
}

int synth_write(const char *path, const synth_options *o, synth_stats *stats, status *st)
{
    double t0 = clock_now_s();
    if (!o->preset) return status_fail(st, STATUS_INVALID, "synth: no preset given");
    if ((unsigned)o->quant >= SYNTH_QUANT_COUNT)
        return status_fail(st, STATUS_INVALID, "synth: unknown quant %d", (int)o->quant);
    if (o->chat_template != SYNTH_TEMPLATE_QWEN35 && o->chat_template != SYNTH_TEMPLATE_CHATML)
        return status_fail(st, STATUS_INVALID, "synth: unknown chat template %d", o->chat_template);
    int n_threads = o->n_threads;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    uint64_t chunk_bytes = o->chunk_bytes ? o->chunk_bytes : DEFAULT_CHUNK_BYTES;

    synth_tensor *plan = NULL;
    int n_t = 0;
    synth_vocab vocab = {0};
    gguf_writer *w = NULL;
    uint64_t *keys = NULL;
    work_item *items = NULL;
    bool created = false;
    int rc;
    work wk;
    memset(&wk, 0, sizeof wk);
    pthread_mutex_init(&wk.lock, NULL);

    if ((rc = synth_plan_mtp(o->preset, o->quant, o->mtp, &plan, &n_t, st))) goto fail;
    if ((rc = synth_vocab_build(&vocab, (uint32_t)o->preset->V, st))) goto fail;
    keys = malloc(sizeof *keys * (size_t)n_t);
    if (!keys) {
        rc = status_fail(st, STATUS_NOMEM, "synth: out of memory");
        goto fail;
    }
    if ((rc = gguf_writer_create(&w, path, st))) goto fail;
    created = true;
    set_metadata(w, o->preset, o->quant, o->seed, o->mtp, (synth_template)o->chat_template,
                 &vocab);
    uint64_t tensor_bytes = 0;
    for (int i = 0; i < n_t; i++) {
        int idx = gguf_writer_add_tensor(w, plan[i].name, plan[i].n_dims, plan[i].ne,
                                         plan[i].type);
        DS_ASSERT(idx == i || idx < 0); /* on -1 begin_data reports the reason */
        keys[i] = synth_fill_key(o->seed, plan[i].name);
        tensor_bytes += plan[i].n_bytes;
    }
    if ((rc = gguf_writer_begin_data(w, st))) goto fail;
    for (int i = 0; i < n_t; i++)
        if (gguf_writer_tensor_bytes(w, i) != plan[i].n_bytes) {
            rc = status_fail(st, STATUS_INTERNAL,
                             "synth: %s: tensor %s: writer size %llu != planned %llu", path,
                             plan[i].name, (unsigned long long)gguf_writer_tensor_bytes(w, i),
                             (unsigned long long)plan[i].n_bytes);
            goto fail;
        }
    synth_vocab_free(&vocab); /* the writer copied it; free before the big part */

    wk.tensors = plan;
    wk.keys = keys;
    wk.w = w;
    if ((rc = make_items(plan, n_t, chunk_bytes, &items, &wk.n_items, &wk.buf_bytes, st)))
        goto fail;
    wk.items = items;
    if ((uint64_t)n_threads > wk.n_items) n_threads = (int)wk.n_items;
    if ((rc = run_threads(&wk, n_threads, st))) goto fail;
    if ((rc = gguf_writer_finish(w, st))) goto fail;

    gguf_writer_destroy(w);
    w = NULL;
    struct stat sb;
    if (stat(path, &sb)) {
        rc = status_fail(st, STATUS_IO, "synth: %s: stat after writing: %s", path,
                         strerror(errno));
        goto fail;
    }
    if (stats) {
        stats->n_tensors = n_t;
        stats->n_bytes = (uint64_t)sb.st_size;
        stats->tensor_bytes = tensor_bytes;
        stats->n_threads = n_threads;
        stats->seconds = clock_now_s() - t0;
    }
    free(items);
    free(keys);
    free(plan);
    pthread_mutex_destroy(&wk.lock);
    return 0;

fail:
    if (w) gguf_writer_destroy(w);
    if (created) unlink(path);
    free(items);
    free(keys);
    free(plan);
    synth_vocab_free(&vocab);
    pthread_mutex_destroy(&wk.lock);
    return rc;
}
