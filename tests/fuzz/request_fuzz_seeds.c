/* Writes the seed corpus of the request decoder fuzzer (tests/fuzz/request_fuzz.c) into DIR:
 *   request_fuzz_seeds DIR
 * GenerateRequests packed with protobuf-c: each prompt kind (text, token_ids, chat), every
 * sampling and stopping field, stop strings, logprobs; WorkerGenerateRequests the same way; and
 * edge cases: negative and huge ids, NaN/inf/negative floats, the largest uint32/uint64
 * values, request ids of 128 and 129 bytes, 16 and 17 stop strings or stop ids, a 257-byte
 * stop string, invalid UTF-8 in text, chat and stop strings, a chat role with '<', an empty
 * chat, two prompt fields of the oneof on the wire, a truncated message, an unknown field, an
 * unknown field numbered 0 in a two-byte tag (in sampling, in a chat prompt's tool). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/deltaserve/v1/deltaserve.pb-c.h"

static const char *g_dir;
static int g_count;

static void save(const char *name, const uint8_t *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "request_fuzz_seeds: cannot write %s\n", path);
        exit(1);
    }
    g_count++;
}

static void save_msg(const char *name, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n + 1);
    if (!buf || protobuf_c_message_pack(m, buf) != n) {
        fprintf(stderr, "request_fuzz_seeds: cannot pack %s\n", name);
        exit(1);
    }
    save(name, buf, n);
    free(buf);
}

#define GEN_INIT DELTASERVE__V1__GENERATE_REQUEST__INIT
#define WORKER_INIT DELTASERVE__V1__WORKER_GENERATE_REQUEST__INIT
#define SAMPLING_INIT DELTASERVE__V1__SAMPLING_PARAMS__INIT
#define STOPPING_INIT DELTASERVE__V1__STOPPING_CRITERIA__INIT

static void router_seeds(void)
{
    static int32_t ids[] = {1, 2, 3, 40, 41};
    static int32_t bad_ids[] = {5, -1, INT32_MAX, INT32_MIN};
    static int32_t stop_ids[17] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    Deltaserve__V1__TokenIds tids = DELTASERVE__V1__TOKEN_IDS__INIT;
    tids.n_ids = 5;
    tids.ids = ids;

    Deltaserve__V1__GenerateRequest g = GEN_INIT;
    g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TEXT;
    g.text = "Hello, w\xc3\xb6rld! <|im_start|>user\n";
    save_msg("r-text", &g.base);

    g.request_id = "req-1";
    g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    g.token_ids = &tids;
    save_msg("r-ids", &g.base);

    Deltaserve__V1__SamplingParams s = SAMPLING_INIT;
    s.temperature = 0.7f;
    s.top_k = 40;
    s.top_p = 0.9f;
    s.min_p = 0.05f;
    s.repetition_penalty = 1.1f;
    s.presence_penalty = 0.5f;
    s.frequency_penalty = -0.5f;
    s.seed = 42;
    Deltaserve__V1__StoppingCriteria sc = STOPPING_INIT;
    sc.max_new_tokens = 16;
    sc.n_stop_token_ids = 2;
    sc.stop_token_ids = stop_ids + 3;
    sc.ignore_eos = 1;
    char *stops[17] = {"\n\n", "END", "\xc3\xa9t\xc3\xa9"};
    g.sampling = &s;
    g.stopping = &sc;
    g.n_stop = 3;
    g.stop = stops;
    g.logprobs = 5;
    save_msg("r-all-fields", &g.base);

    Deltaserve__V1__ChatMessage m1 = DELTASERVE__V1__CHAT_MESSAGE__INIT,
                                m2 = DELTASERVE__V1__CHAT_MESSAGE__INIT;
    m1.role = "system";
    m1.content = "You are terse.";
    m2.role = "user";
    m2.content = "2+2?";
    Deltaserve__V1__ChatMessage *msgs[] = {&m1, &m2};
    Deltaserve__V1__ChatPrompt chat = DELTASERVE__V1__CHAT_PROMPT__INIT;
    chat.n_messages = 2;
    chat.messages = msgs;
    g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_CHAT;
    g.chat = &chat;
    save_msg("r-chat", &g.base);

    /* edge cases, one change each from a valid request */
    Deltaserve__V1__GenerateRequest e = GEN_INIT;
    e.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    e.token_ids = &tids;
    Deltaserve__V1__SamplingParams es = SAMPLING_INIT;
    e.sampling = &es;
    es.temperature = NAN;
    save_msg("r-temp-nan", &e.base);
    es.temperature = -INFINITY;
    save_msg("r-temp-neginf", &e.base);
    es.temperature = 0;
    es.top_k = INT32_MIN;
    save_msg("r-topk-min", &e.base);
    es.top_k = 0;
    es.top_p = 1.0000001f;
    save_msg("r-topp-over", &e.base);
    es.top_p = 0;
    es.repetition_penalty = -1;
    save_msg("r-reppen-neg", &e.base);
    es.repetition_penalty = 0;
    es.presence_penalty = 2.0f;
    es.frequency_penalty = -2.0000002f;
    save_msg("r-penalties-edge", &e.base);
    es.presence_penalty = es.frequency_penalty = 0;
    es.seed = UINT64_MAX;
    save_msg("r-seed-max", &e.base);
    e.sampling = NULL;
    e.logprobs = UINT32_MAX;
    save_msg("r-logprobs-max", &e.base);
    e.logprobs = 21;
    save_msg("r-logprobs-21", &e.base);
    e.logprobs = 20;
    save_msg("r-logprobs-20", &e.base);
    e.logprobs = 0;

    Deltaserve__V1__TokenIds bt = DELTASERVE__V1__TOKEN_IDS__INIT;
    bt.n_ids = 4;
    bt.ids = bad_ids;
    e.token_ids = &bt;
    save_msg("r-ids-negative-huge", &e.base);
    bt.n_ids = 0;
    save_msg("r-ids-empty", &e.base);
    e.token_ids = &tids;

    Deltaserve__V1__StoppingCriteria esc = STOPPING_INIT;
    e.stopping = &esc;
    esc.max_new_tokens = UINT32_MAX;
    save_msg("r-maxnew-max", &e.base);
    esc.max_new_tokens = 0;
    esc.n_stop_token_ids = 17;
    esc.stop_token_ids = stop_ids;
    save_msg("r-stopids-17", &e.base);
    esc.n_stop_token_ids = 16;
    save_msg("r-stopids-16", &e.base);
    esc.n_stop_token_ids = 4;
    esc.stop_token_ids = bad_ids;
    save_msg("r-stopids-bad", &e.base);
    e.stopping = NULL;

    char id[130];
    memset(id, 'a', sizeof id - 1);
    id[129] = '\0';
    e.request_id = id;
    save_msg("r-id-129", &e.base);
    e.request_id = id + 1;
    save_msg("r-id-128", &e.base);
    e.request_id = "";

    char long_stop[258];
    memset(long_stop, 's', sizeof long_stop - 1);
    long_stop[257] = '\0';
    for (int i = 3; i < 17; i++) stops[i] = "x";
    e.stop = stops;
    e.n_stop = 17;
    save_msg("r-stops-17", &e.base);
    e.n_stop = 16;
    save_msg("r-stops-16", &e.base);
    char *one[1] = {long_stop};
    e.stop = one;
    e.n_stop = 1;
    save_msg("r-stop-257", &e.base);
    one[0] = long_stop + 1;
    save_msg("r-stop-256", &e.base);
    one[0] = "ok\xc3";
    save_msg("r-stop-bad-utf8", &e.base);
    one[0] = "";
    save_msg("r-stop-empty", &e.base);
    one[0] = "\xed\xa0\x80"; /* a surrogate */
    save_msg("r-stop-surrogate", &e.base);
    e.n_stop = 0;

    e.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TEXT;
    e.text = "\xc0\xaf overlong";
    save_msg("r-text-overlong", &e.base);
    e.text = "\xf4\x90\x80\x80 above U+10FFFF";
    save_msg("r-text-above-max", &e.base);
    e.text = "";
    save_msg("r-text-empty", &e.base);
    e.text = " ";
    save_msg("r-text-space", &e.base);

    e.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_CHAT;
    e.chat = &chat;
    m1.role = "us<er";
    save_msg("r-chat-role-lt", &e.base);
    m1.role = "";
    save_msg("r-chat-role-empty", &e.base);
    m1.role = "system";
    m2.content = "\xff\xfe";
    save_msg("r-chat-bad-utf8", &e.base);
    m2.content = "2+2?";
    chat.n_messages = 0;
    save_msg("r-chat-empty", &e.base);
    chat.n_messages = 2;

    /* two fields of the oneof on the wire: text, then token_ids (the last one wins) */
    Deltaserve__V1__GenerateRequest a = GEN_INIT, b = GEN_INIT;
    a.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TEXT;
    a.text = "first";
    b.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    b.token_ids = &tids;
    size_t na = protobuf_c_message_get_packed_size(&a.base);
    size_t nb = protobuf_c_message_get_packed_size(&b.base);
    uint8_t *two = malloc(na + nb + 16);
    if (!two) exit(1);
    protobuf_c_message_pack(&a.base, two);
    protobuf_c_message_pack(&b.base, two + na);
    save("r-oneof-twice", two, na + nb);
    protobuf_c_message_pack(&b.base, two);
    protobuf_c_message_pack(&a.base, two + nb);
    save("r-oneof-twice-rev", two, na + nb);
    save("r-truncated", two, nb - 1);
    /* an unknown field 99 (varint) after a valid request */
    size_t k = protobuf_c_message_pack(&b.base, two);
    two[k++] = 0x98, two[k++] = 0x06, two[k++] = 0x7f;
    save("r-unknown-field", two, k);
    free(two);
    save("empty", (const uint8_t *)"", 0);
    /* finding 1 of docs/FUZZ.md: token_ids, then sampling holding an unknown field whose tag
     * is 81 00 (field 0 as a two-byte varint): protobuf-c unpacks it but not its own packing */
    static const uint8_t field0[] = {0x1a, 0x03, 0x0a, 0x01, 0x05, 0x2a, 0x0a, 0x81, 0x00,
                                     0, 0, 0, 0, 0, 0, 0, 0};
    save("r-sampling-field0-twobyte", field0, sizeof field0);
    /* the same tag inside a chat prompt's tool (ChatPrompt.tools): a system turn, then a tool
     * holding field 8 and the 81 00 field */
    static const uint8_t tool0[] = {0x22, 0x28, 0x0a, 0x18, 0x0a, 0x06, 's', 'y', 's', 't', 'e',
                                    'm', 0x12, 0x0e, 'Y', 'o', 'u', ' ', 'a', 'r', 'e', ' ', 't',
                                    'e', 'r', 's', 'e', '.', 0x1a, 0x0c, 0x40, 0x2a, 0x81, 0x00,
                                    0x03, 0, 0, 0, 0, 0, 0, 0};
    save("r-chat-tool-field0-twobyte", tool0, sizeof tool0);
}

static void worker_seeds(void)
{
    static int32_t ids[] = {1, 2, 3};
    static int32_t stop_ids[17] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    static int32_t bad[] = {-1, INT32_MAX};
    Deltaserve__V1__WorkerGenerateRequest w = WORKER_INIT;
    w.request_id = "w-1";
    w.n_prompt_token_ids = 3;
    w.prompt_token_ids = ids;
    save_msg("w-ids", &w.base);

    Deltaserve__V1__SamplingParams s = SAMPLING_INIT;
    s.temperature = 1.0f;
    s.top_k = 5;
    s.top_p = 0.5f;
    s.min_p = 0.1f;
    s.repetition_penalty = 1.3f;
    s.presence_penalty = -1;
    s.frequency_penalty = 1;
    s.seed = 7;
    Deltaserve__V1__StoppingCriteria sc = STOPPING_INIT;
    sc.max_new_tokens = 4;
    sc.n_stop_token_ids = 3;
    sc.stop_token_ids = stop_ids;
    sc.ignore_eos = 1;
    w.sampling = &s;
    w.stopping = &sc;
    w.logprobs = 3;
    save_msg("w-all-fields", &w.base);

    sc.max_new_tokens = 5; /* 3 + 5 fills a context of 8 exactly */
    save_msg("w-fill-ctx8", &w.base);
    sc.max_new_tokens = UINT32_MAX;
    save_msg("w-maxnew-max", &w.base);
    sc.max_new_tokens = 0;
    sc.n_stop_token_ids = 17;
    save_msg("w-stopids-17", &w.base);
    sc.n_stop_token_ids = 2;
    sc.stop_token_ids = bad;
    save_msg("w-stopids-bad", &w.base);
    w.stopping = NULL;
    s.top_p = -0.0f;
    s.min_p = INFINITY;
    save_msg("w-minp-inf", &w.base);
    w.sampling = NULL;
    w.logprobs = UINT32_MAX;
    save_msg("w-logprobs-max", &w.base);
    w.logprobs = 0;
    w.prompt_token_ids = bad;
    w.n_prompt_token_ids = 2;
    save_msg("w-ids-bad", &w.base);
    w.n_prompt_token_ids = 0;
    save_msg("w-ids-empty", &w.base);
    static int32_t many[8];
    w.prompt_token_ids = many;
    w.n_prompt_token_ids = 8; /* a context of 8 leaves no room */
    save_msg("w-ids-8", &w.base);
    w.n_prompt_token_ids = 7;
    save_msg("w-ids-7", &w.base);
    char id[130];
    memset(id, 'w', sizeof id - 1);
    id[129] = '\0';
    w.request_id = id;
    save_msg("w-id-129", &w.base);
    w.request_id = "\xff\x00";
    save_msg("w-id-bad-utf8", &w.base);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: request_fuzz_seeds DIR\n");
        return 2;
    }
    g_dir = argv[1];
    router_seeds();
    worker_seeds();
    printf("request_fuzz_seeds: %d seeds in %s\n", g_count, g_dir);
    return 0;
}
