/* Unit tests for model/fwd_plan: a roomy plan keeps the wanted context and every slot's full
 * context in the pool; chosen slots fit a quarter context each; a context that does not fit
 * shrinks (ctx_fit) to the longest multiple of FWD_PLAN_CTX_STEP whose one slot fits, and is
 * refused with the sizes named without ctx_fit; given slots and KV blocks that do not fit are
 * refused; the pool never exceeds the room; bad inputs are STATUS_INVALID. */
#include <CUnit/Basic.h>
#include <string.h>

#include "model/fwd_plan.h"
#include "tests/testutil/testutil.h"

#define MIB (1ull << 20)

/* the tiny model on the CPU: 1 KiB of KV a position, blocks of 64 */
static fwd_plan_in tiny(uint64_t room, int n_ctx, bool fit, int slots)
{
    return (fwd_plan_in){.room = room, .room_what = "test room", .slot_bytes = 200 * 1024,
                         .pos_bytes = 5, .block_bytes = 64 * 1024, .block_tokens = 64,
                         .n_ctx = n_ctx, .ctx_fit = fit, .n_slots = slots, .max_slots = 8};
}

static void check_bytes(const fwd_plan_in *in, const fwd_plan *p)
{
    const uint64_t own = in->slot_bytes + (uint64_t)p->n_ctx * in->pos_bytes;
    const uint64_t want = (uint64_t)p->n_ctx * in->ctx_bytes + (uint64_t)p->n_slots * own +
                          (uint64_t)p->n_blocks * in->block_bytes;
    CU_ASSERT_EQUAL(p->bytes, want);
    CU_ASSERT(p->bytes <= in->room);
    const int64_t per_seq = (p->n_ctx + in->block_tokens - 1) / in->block_tokens;
    if (!in->kv_blocks) CU_ASSERT(p->n_blocks >= per_seq);
}

static void test_roomy(void)
{
    fwd_plan p;
    status st = {0};
    const fwd_plan_in in = tiny(64ull << 30, 262144, true, 0);
    CU_ASSERT_EQUAL_FATAL(fwd_plan_make(&in, &p, &st), STATUS_OK);
    CU_ASSERT_EQUAL(p.n_ctx, 262144);
    CU_ASSERT_EQUAL(p.n_slots, 8);
    CU_ASSERT_EQUAL(p.n_blocks, 8 * 4096);
    CU_ASSERT_FALSE(p.shrunk);
    CU_ASSERT_PTR_NOT_NULL(strstr(p.why, "context 262144 tokens, 8 slots"));
    CU_ASSERT_PTR_NOT_NULL(strstr(p.why, "test room"));
    CU_ASSERT_PTR_NULL(strstr(p.why, "does not fit"));
    check_bytes(&in, &p);
}

static void test_chosen_slots_quarter(void)
{
    fwd_plan p;
    status st = {0};
    /* 600 MiB: a full context is 256 MiB of KV; a quarter 64 MiB: 600 / (64.2 + 1.3) ~ 9 -> 8
     * at most; the pool: what is left, fewer than 8 full contexts */
    const fwd_plan_in in = tiny(600 * MIB, 262144, true, 0);
    CU_ASSERT_EQUAL_FATAL(fwd_plan_make(&in, &p, &st), STATUS_OK);
    CU_ASSERT_EQUAL(p.n_ctx, 262144);
    CU_ASSERT_EQUAL(p.n_slots, 8);
    CU_ASSERT(p.n_blocks < 8 * 4096 && p.n_blocks >= 4096);
    check_bytes(&in, &p);
    /* 300 MiB: one full context and a few quarter ones */
    const fwd_plan_in in2 = tiny(300 * MIB, 262144, true, 0);
    CU_ASSERT_EQUAL_FATAL(fwd_plan_make(&in2, &p, &st), STATUS_OK);
    CU_ASSERT(p.n_slots >= 1 && p.n_slots < 8);
    CU_ASSERT_PTR_NOT_NULL(strstr(p.why, "as many as fit a quarter context each"));
    check_bytes(&in2, &p);
}

static void test_shrink(void)
{
    fwd_plan p;
    status st = {0};
    const fwd_plan_in in = tiny(100 * MIB, 262144, true, 0);
    CU_ASSERT_EQUAL_FATAL(fwd_plan_make(&in, &p, &st), STATUS_OK);
    CU_ASSERT_TRUE(p.shrunk);
    CU_ASSERT_EQUAL(p.n_ctx % FWD_PLAN_CTX_STEP, 0);
    CU_ASSERT(fwd_plan_one_slot_bytes(&in, p.n_ctx) <= in.room);
    CU_ASSERT(fwd_plan_one_slot_bytes(&in, p.n_ctx + FWD_PLAN_CTX_STEP) > in.room);
    CU_ASSERT_EQUAL(p.n_slots, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(p.why, "the model's 262144 does not fit"));
    check_bytes(&in, &p);
    /* the same without ctx_fit: refused, sizes named */
    const fwd_plan_in given = tiny(100 * MIB, 262144, false, 0);
    CU_ASSERT_EQUAL(fwd_plan_make(&given, &p, &st), STATUS_NOMEM);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "one sequence of 262144 positions needs"));
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "test room"));
    /* nothing fits at all */
    const fwd_plan_in none = tiny(100 * 1024, 262144, true, 0);
    CU_ASSERT_EQUAL(fwd_plan_make(&none, &p, &st), STATUS_NOMEM);
    /* a short wanted context that fits is kept as it is (not rounded) */
    const fwd_plan_in small = tiny(100 * MIB, 777, true, 0);
    CU_ASSERT_EQUAL_FATAL(fwd_plan_make(&small, &p, &st), STATUS_OK);
    CU_ASSERT_EQUAL(p.n_ctx, 777);
    CU_ASSERT_FALSE(p.shrunk);
}

static void test_ctx_bytes(void)
{
    fwd_plan p;
    status st = {0};
    /* a context-sized scratch (the CUDA attention partials) counts once, and shrinks with it */
    fwd_plan_in in = tiny(1024 * MIB, 262144, true, 0);
    in.ctx_bytes = 4096; /* 1 GiB at 262144 */
    CU_ASSERT_EQUAL_FATAL(fwd_plan_make(&in, &p, &st), STATUS_OK);
    CU_ASSERT_TRUE(p.shrunk);
    CU_ASSERT(fwd_plan_one_slot_bytes(&in, p.n_ctx) <= in.room);
    check_bytes(&in, &p);
}

static void test_given(void)
{
    fwd_plan p;
    status st = {0};
    /* given slots: kept; the pool shrinks below their full contexts to what fits */
    const fwd_plan_in in = tiny(600 * MIB, 262144, false, 4);
    CU_ASSERT_EQUAL_FATAL(fwd_plan_make(&in, &p, &st), STATUS_OK);
    CU_ASSERT_EQUAL(p.n_slots, 4);
    CU_ASSERT(p.n_blocks < 4 * 4096);
    CU_ASSERT_PTR_NOT_NULL(strstr(p.why, "(given)"));
    check_bytes(&in, &p);
    /* too many given slots for one full context beside their state */
    const fwd_plan_in many = tiny(260 * MIB, 262144, false, 64);
    CU_ASSERT_EQUAL(fwd_plan_make(&many, &p, &st), STATUS_NOMEM);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "64 slots of 262144 positions need"));
    /* given KV blocks beyond the room */
    fwd_plan_in blocks = tiny(100 * MIB, 4096, false, 2);
    blocks.kv_blocks = 10000;
    CU_ASSERT_EQUAL(fwd_plan_make(&blocks, &p, &st), STATUS_NOMEM);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "10000 KV blocks"));
    blocks.kv_blocks = 3; /* fewer than a context: the caller's choice */
    CU_ASSERT_EQUAL_FATAL(fwd_plan_make(&blocks, &p, &st), STATUS_OK);
    CU_ASSERT_EQUAL(p.n_blocks, 3);
}

static void test_invalid(void)
{
    fwd_plan p;
    status st = {0};
    fwd_plan_in in = tiny(1 << 30, 0, true, 0);
    CU_ASSERT_EQUAL(fwd_plan_make(&in, &p, &st), STATUS_INVALID);
    in = tiny(1 << 30, 1024, true, -1);
    CU_ASSERT_EQUAL(fwd_plan_make(&in, &p, &st), STATUS_INVALID);
    in = tiny(1 << 30, 1024, true, 0);
    in.block_bytes = 0;
    CU_ASSERT_EQUAL(fwd_plan_make(&in, &p, &st), STATUS_INVALID);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("fwd_plan", NULL, NULL);
    CU_add_test(s, "roomy", test_roomy);
    CU_add_test(s, "chosen_slots_quarter", test_chosen_slots_quarter);
    CU_add_test(s, "shrink", test_shrink);
    CU_add_test(s, "ctx_bytes", test_ctx_bytes);
    CU_add_test(s, "given", test_given);
    CU_add_test(s, "invalid", test_invalid);
    return testutil_cunit_run();
}
