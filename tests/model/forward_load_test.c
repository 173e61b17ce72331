/* qwen35_model_load on variants and malformed copies of the reference models (written with
 * gguf_rewrite): the variants seen in the wild load and give bit-identical logits; each broken
 * file fails with the right code and a message naming the key or tensor. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward_test_util.h"
#include "gguf/quant.h"
#include "gguf_rewrite.h"
#include "model/forward.h"
#include "tests/model/ref_cases.h"
#include "tests/testutil/testutil.h"

static char src_tied[4096], src_untied[4096], tmp[4096];
static ref_prompt *prompts;
static qwen35_config cfg_tied; /* the tied reference model's config: the MTP block's shapes */
static int n_prompts;

static int setup(void)
{
    qwen35_model *m;
    status st;
    ref_case_resolve_path("tiny-r2-tied", ".gguf", src_tied, sizeof src_tied);
    ref_case_resolve_path("tiny-r1-untied", ".gguf", src_untied, sizeof src_untied);
    snprintf(tmp, sizeof tmp, "%s/forward_load_%d.gguf", testutil_tmp_dir(), (int)getpid());
    ref_case tied;
    if (ref_case_resolve("tiny-r2-tied", &tied)) return 1;
    if (qwen35_model_load(&m, src_tied, &st)) return 1;
    cfg_tied = m->cfg;
    qwen35_model_free(m);
    n_prompts = forward_test_read_prompts_in(tied.dir, tied.name, &prompts);
    return n_prompts > 0 ? 0 : 1;
}

static int teardown(void)
{
    unlink(tmp);
    forward_test_free_prompts(prompts, n_prompts);
    return 0;
}

/* ---- the edits ---- */

typedef struct edit {
    const char *drop_kv;       /* key to drop */
    const char *drop_tensor;   /* tensor to drop */
    const char *rename_from, *rename_to;
    const char *reshape;       /* tensor whose ne[1] shrinks by one */
    const char *retype;        /* tensor re-typed to F16 */
    bool ollama, nextn, recurrent_layers, bad_heads, not_qwen;
    const char *nextn_skip;    /* with nextn: MTP tensor (suffix after blk.4.) left out */
} edit;


static bool keep_kv(void *arg, const gguf_kv *kv)
{
    const edit *e = arg;
    if (e->drop_kv && gguf_str_eq(kv->key, e->drop_kv)) return false;
    if (e->ollama && gguf_str_eq(kv->key, "qwen35.full_attention_interval")) return false;
    return true;
}

static void extra_kv(void *arg, gguf_writer *w)
{
    const edit *e = arg;
    if (e->not_qwen) gguf_writer_set_str(w, "general.architecture", "llama");
    if (e->bad_heads) gguf_writer_set_u32(w, "qwen35.attention.head_count", 3);
    if (e->ollama) {
        uint32_t kv[4] = {0, 0, 0, 2}, nh[4] = {4, 4, 4, 4}, ff[4] = {768, 768, 768, 768};
        int32_t sec[3] = {3, 3, 2};
        gguf_writer_set_arr(w, "qwen35.attention.head_count_kv", GGUF_VTYPE_UINT32, kv, 4);
        gguf_writer_set_arr(w, "qwen35.attention.head_count", GGUF_VTYPE_UINT32, nh, 4);
        gguf_writer_set_arr(w, "qwen35.feed_forward_length", GGUF_VTYPE_UINT32, ff, 4);
        gguf_writer_set_arr(w, "qwen35.rope.dimension_sections", GGUF_VTYPE_INT32, sec, 3);
        gguf_writer_set_arr(w, "qwen35.mrope_sections", GGUF_VTYPE_INT32, sec, 3);
    }
    if (e->nextn) {
        gguf_writer_set_u32(w, "qwen35.block_count", 5);
        gguf_writer_set_u32(w, "qwen35.nextn_predict_layers", 1);
    }
    if (e->recurrent_layers) {
        bool rl[4] = {true, true, true, false};
        gguf_writer_set_arr(w, "qwen35.attention.recurrent_layers", GGUF_VTYPE_BOOL, rl, 4);
        gguf_writer_set_u32(w, "qwen35.full_attention_interval", 2); /* overridden by the array */
    }
}

static void edit_tensor(void *arg, const gguf_file *f, const gguf_tensor *t, gguf_rewrite_tensor *o)
{
    const edit *e = arg;
    if (e->drop_tensor && !strcmp(o->name, e->drop_tensor)) o->drop = true;
    if (e->rename_from && !strcmp(o->name, e->rename_from)) snprintf(o->name, sizeof o->name, "%s", e->rename_to);
    if (e->reshape && !strcmp(o->name, e->reshape)) o->ne[1]--;
    if (e->retype && !strcmp(o->name, e->retype)) o->type = GGML_TYPE_F16;
    if (e->ollama) {
        size_t n = strlen(o->name);
        if (n > 11 && !strcmp(o->name + n - 11, "ssm_dt.bias")) o->name[n - 5] = 0; /* ssm_dt */
    }
}

static int extra_tensors(void *arg, gguf_writer *w)
{
    const edit *e = arg;
    int n = 0;
    uint64_t ne[4] = {256, 8, 1, 1};
    if (e->ollama) {
        gguf_writer_add_tensor(w, "v.blk.0.attn_q.weight", 2, ne, GGML_TYPE_F32), n++;
        gguf_writer_add_tensor(w, "mtp.fc.weight", 2, ne, GGML_TYPE_F32), n++;
    }
    if (e->nextn) { /* a whole MTP block of the converter's 15 tensors (zeros), layer 4 */
        const qwen35_config *c = &cfg_tied;
        uint64_t H = (uint64_t)c->H, F = (uint64_t)c->F, dh = (uint64_t)c->d_h;
        uint64_t q = (uint64_t)c->n_h * dh, kv = (uint64_t)c->n_kv * dh;
        const struct {
            const char *name;
            uint64_t n0, n1;
        } mtp[] = {
            {"attn_norm.weight", H, 1},        {"post_attention_norm.weight", H, 1},
            {"ffn_gate.weight", H, F},         {"ffn_up.weight", H, F},
            {"ffn_down.weight", F, H},         {"attn_q.weight", H, 2 * q},
            {"attn_k.weight", H, kv},          {"attn_v.weight", H, kv},
            {"attn_output.weight", q, H},      {"attn_q_norm.weight", dh, 1},
            {"attn_k_norm.weight", dh, 1},     {"nextn.eh_proj.weight", 2 * H, H},
            {"nextn.enorm.weight", H, 1},      {"nextn.hnorm.weight", H, 1},
            {"nextn.shared_head_norm.weight", H, 1},
        };
        for (size_t i = 0; i < sizeof mtp / sizeof mtp[0]; i++) {
            if (e->nextn_skip && !strcmp(e->nextn_skip, mtp[i].name)) continue;
            char name[96];
            snprintf(name, sizeof name, "blk.4.%s", mtp[i].name);
            uint64_t d[4] = {mtp[i].n0, mtp[i].n1, 1, 1};
            gguf_writer_add_tensor(w, name, mtp[i].n1 > 1 ? 2 : 1, d, GGML_TYPE_F32), n++;
        }
    }
    return n;
}

static int write_edit(const char *src, edit *e)
{
    gguf_rewrite_opts o = {.tensor = edit_tensor, .keep_kv = keep_kv, .extra_kv = extra_kv,
                           .extra_tensors = extra_tensors, .arg = e};
    status st;
    int rc = gguf_rewrite(src, tmp, &o, &st);
    if (rc) fprintf(stderr, "rewrite: %s\n", st.msg);
    return rc;
}

/* Logits of prompt 0 (all rows) through the model at path; NULL on load failure. */
static float *logits_of(const char *path, status *st)
{
    qwen35_model *m;
    if (qwen35_model_load(&m, path, st)) return NULL;
    const ref_prompt *p = &prompts[0];
    float *lg = malloc(sizeof(float) * p->rows * p->V);
    qwen35_ctx *ctx;
    qwen35_state *s;
    int32_t *ids = forward_test_full_ids(p);
    CU_ASSERT_FATAL(qwen35_ctx_create(m, &(qwen35_ctx_opts){.n_threads = 1}, &ctx, st) == 0);
    CU_ASSERT_FATAL(qwen35_state_create(m, p->rows, &s, st) == 0);
    CU_ASSERT(qwen35_prefill(ctx, s, ids, p->rows, lg, true, st) == 0);
    free(ids);
    qwen35_state_destroy(s);
    qwen35_ctx_destroy(ctx);
    qwen35_model_free(m);
    return lg;
}

static void check_same_logits(edit *e)
{
    status st;
    float *ref = logits_of(src_tied, &st);
    CU_ASSERT_FATAL(ref != NULL);
    CU_ASSERT_FATAL(write_edit(src_tied, e) == 0);
    float *got = logits_of(tmp, &st);
    if (!got) fprintf(stderr, "variant failed to load: %s\n", st.msg);
    CU_ASSERT_FATAL(got != NULL);
    CU_ASSERT_EQUAL(memcmp(got, ref, sizeof(float) * prompts[0].rows * prompts[0].V), 0);
    free(ref), free(got);
}

static void test_variant_ollama(void) { check_same_logits(&(edit){.ollama = true}); }
/* A file with an MTP block: the main model's logits are unchanged and the block is bound. */
static void test_variant_nextn(void)
{
    check_same_logits(&(edit){.nextn = true});
    qwen35_model *m;
    status st;
    CU_ASSERT_EQUAL_FATAL(qwen35_model_load(&m, tmp, &st), 0);
    CU_ASSERT_EQUAL(m->cfg.n_layer, 4);
    CU_ASSERT_EQUAL(m->cfg.n_nextn, 1);
    CU_ASSERT(m->mtp.present);
    CU_ASSERT_EQUAL(m->mtp.layer_index, 4);
    CU_ASSERT_EQUAL(m->mtp.eh_proj.n_in, 2 * m->cfg.H);
    CU_ASSERT_EQUAL(m->mtp.eh_proj.n_out, m->cfg.H);
    CU_ASSERT_PTR_NOT_EQUAL(m->mtp.head_norm, m->output_norm); /* the file's shared_head_norm */
    CU_ASSERT_PTR_EQUAL(m->mtp.embd.data, m->tok_embd.data);   /* no nextn.embed_tokens */
    CU_ASSERT_PTR_EQUAL(m->mtp.head.data, m->output.data);     /* no nextn.shared_head_head */
    qwen35_model_free(m);
    /* without shared_head_norm the head norm is output_norm */
    CU_ASSERT_FATAL(write_edit(src_tied, &(edit){.nextn = true, .nextn_skip = "nextn.shared_head_norm.weight"}) == 0);
    CU_ASSERT_EQUAL_FATAL(qwen35_model_load(&m, tmp, &st), 0);
    CU_ASSERT_PTR_EQUAL(m->mtp.head_norm, m->output_norm);
    qwen35_model_free(m);
    /* a model without one has none */
    CU_ASSERT_EQUAL_FATAL(qwen35_model_load(&m, src_tied, &st), 0);
    CU_ASSERT(!m->mtp.present);
    qwen35_model_free(m);
}
static void test_variant_recurrent_layers(void) { check_same_logits(&(edit){.recurrent_layers = true}); }

static void check_fails(const char *src, edit *e, int code, const char *needle)
{
    CU_ASSERT_FATAL(write_edit(src, e) == 0);
    qwen35_model *m = NULL;
    status st = {0};
    int rc = qwen35_model_load(&m, tmp, &st);
    if (rc != code || !strstr(st.msg, needle))
        fprintf(stderr, "expected code %d with '%s', got %d: %s\n", code, needle, rc, st.msg);
    CU_ASSERT_EQUAL(rc, code);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, needle));
    CU_ASSERT_PTR_NULL(m);
}

static void test_errors(void)
{
    check_fails(src_tied, &(edit){.not_qwen = true}, STATUS_UNSUPPORTED, "'llama' is not qwen35");
    check_fails(src_tied, &(edit){.drop_tensor = "blk.1.ssm_a"}, STATUS_FORMAT, "missing tensor 'blk.1.ssm_a'");
    check_fails(src_tied, &(edit){.drop_tensor = "blk.3.attn_k_norm.weight"}, STATUS_FORMAT, "blk.3.attn_k_norm.weight");
    check_fails(src_tied, &(edit){.reshape = "blk.0.ffn_up.weight"}, STATUS_FORMAT, "'blk.0.ffn_up.weight' has shape [256, 767");
    check_fails(src_untied, &(edit){.reshape = "output.weight"}, STATUS_FORMAT, "'output.weight' has shape");
    check_fails(src_tied, &(edit){.retype = "blk.2.ssm_conv1d.weight"}, STATUS_FORMAT, "blk.2.ssm_conv1d.weight");
    check_fails(src_tied, &(edit){.drop_kv = "qwen35.embedding_length"}, STATUS_FORMAT, "qwen35.embedding_length");
    check_fails(src_tied, &(edit){.drop_kv = "qwen35.ssm.group_count"}, STATUS_FORMAT, "qwen35.ssm.group_count");
    check_fails(src_tied, &(edit){.bad_heads = true}, STATUS_FORMAT, "3 attention heads");
    check_fails(src_tied, &(edit){.nextn = true, .nextn_skip = "nextn.hnorm.weight"}, STATUS_FORMAT,
                "missing tensor 'blk.4.nextn.hnorm.weight'");
    check_fails(src_tied, &(edit){.nextn = true, .nextn_skip = "attn_k.weight"}, STATUS_FORMAT,
                "missing tensor 'blk.4.attn_k.weight'");
    check_fails(src_tied, &(edit){.rename_from = "token_embd.weight", .rename_to = "tok.weight"}, STATUS_FORMAT, "token_embd.weight");
    qwen35_model *m = NULL;
    status st;
    CU_ASSERT_NOT_EQUAL(qwen35_model_load(&m, "/nonexistent/x.gguf", &st), 0);
    CU_ASSERT_PTR_NULL(m);
}

/* A re-typed matrix (F16 token embedding) is accepted: any supported type goes. */
static void test_retype_matrix_ok(void)
{
    CU_ASSERT_FATAL(write_edit(src_tied, &(edit){.retype = "token_embd.weight"}) == 0);
    qwen35_model *m;
    status st;
    CU_ASSERT_EQUAL_FATAL(qwen35_model_load(&m, tmp, &st), 0);
    CU_ASSERT_EQUAL(m->tok_embd.type, GGML_TYPE_F16);
    CU_ASSERT_EQUAL(m->output.type, GGML_TYPE_F16); /* tied */
    CU_ASSERT_EQUAL(m->tok_embd.row_bytes, 256 * 2);
    qwen35_model_free(m);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("forward_load", setup, teardown);
    CU_add_test(s, "variant_ollama", test_variant_ollama);
    CU_add_test(s, "variant_nextn", test_variant_nextn);
    CU_add_test(s, "variant_recurrent_layers", test_variant_recurrent_layers);
    CU_add_test(s, "errors", test_errors);
    CU_add_test(s, "retype_matrix_ok", test_retype_matrix_ok);
    return testutil_cunit_run();
}
