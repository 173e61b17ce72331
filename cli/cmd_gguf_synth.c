/* deltaserve gguf synth: write a synthetic Qwen3.5 GGUF of a real shape (gguf/synth.h). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/flags.h"
#include "gguf/synth.h"
#include "gguf/synth_vocab.h"

typedef struct synth_opts {
    const char *preset;
    const char *quant;
    int64_t seed;
    int threads;
    int mtp; /* FLAG_BOOL */
    const char *chat_template;
    const char *output;
} synth_opts;

static const flag_spec synth_flags[] = {
    {"preset", "DS_SYNTH_PRESET", "tiny", FLAG_STR, offsetof(synth_opts, preset),
     "model shape: tiny, 0.8b, 2b, 4b, 9b, 27b"},
    {"quant", "DS_SYNTH_QUANT", "q4_k_m", FLAG_STR, offsetof(synth_opts, quant),
     "file type: f32, f16, bf16, q8_0, q4_k_m"},
    {"seed", "DS_SYNTH_SEED", "1", FLAG_I64, offsetof(synth_opts, seed),
     "RNG seed (same seed, same bytes)"},
    {"threads", "DS_THREADS", "0", FLAG_INT, offsetof(synth_opts, threads),
     "writer threads (0: online CPUs)"},
    {"mtp", "DS_SYNTH_MTP", "false", FLAG_BOOL, offsetof(synth_opts, mtp),
     "also write the MTP (nextn) block of a converted checkpoint"},
    {"chat-template", "DS_SYNTH_CHAT_TEMPLATE", "qwen35", FLAG_STR,
     offsetof(synth_opts, chat_template),
     "tokenizer.chat_template: qwen35 (Qwen3.5's as published, as the real models) or chatml "
     "(a short ChatML without thinking)"},
    {"output", NULL, NULL, FLAG_STR, offsetof(synth_opts, output), "output file (also -o FILE)"},
    {0},
};

#define USAGE "deltaserve gguf synth"

int cmd_gguf_synth(int argc, char **argv)
{
    /* -o FILE is accepted as --output FILE */
    char **args = malloc(sizeof *args * (size_t)(argc + 1));
    if (!args) {
        fprintf(stderr, "%s: out of memory\n", USAGE);
        return 1;
    }
    for (int i = 0; i < argc; i++) args[i] = !strcmp(argv[i], "-o") ? "--output" : argv[i];
    args[argc] = NULL;

    synth_opts o;
    memset(&o, 0, sizeof o);
    status st;
    status_clear(&st);
    int rc = flags_parse(synth_flags, &o, argc, args, USAGE, &st);
    free(args);
    if (rc == STATUS_CANCELLED) return 0; /* --help */
    if (rc) {
        fprintf(stderr, "%s\n", st.msg);
        return 2;
    }
    const synth_preset *p = synth_preset_find(o.preset);
    int q = synth_quant_parse(o.quant);
    if (!p) {
        fprintf(stderr, "%s: unknown --preset '%s' (tiny, 0.8b, 2b, 4b, 9b, 27b)\n", USAGE,
                o.preset ? o.preset : "");
        return 2;
    }
    int tmpl = synth_template_parse(o.chat_template);
    if (tmpl < 0) {
        fprintf(stderr, "%s: unknown --chat-template '%s' (qwen35, chatml)\n", USAGE,
                o.chat_template ? o.chat_template : "");
        return 2;
    }
    if (q < 0) {
        fprintf(stderr, "%s: unknown --quant '%s' (f32, f16, bf16, q8_0, q4_k_m)\n", USAGE,
                o.quant ? o.quant : "");
        return 2;
    }
    if (!o.output || !*o.output) {
        fprintf(stderr, "%s: -o FILE is required\n", USAGE);
        return 2;
    }
    if (o.threads < 0 || o.seed < 0) {
        fprintf(stderr, "%s: --threads and --seed must not be negative\n", USAGE);
        return 2;
    }

    synth_options so = {.preset = p, .quant = (synth_quant)q, .seed = (uint64_t)o.seed,
                        .mtp = o.mtp != 0, .chat_template = tmpl, .n_threads = o.threads};
    synth_stats s;
    if (synth_write(o.output, &so, &s, &st)) {
        fprintf(stderr, "%s: %s\n", USAGE, st.msg);
        return 1;
    }
    printf("synth: preset %s%s quant %s tensors %d bytes %llu seconds %.2f GB/s %.2f threads %d "
           "-> %s\n",
           p->name, o.mtp ? " +mtp" : "", synth_quant_name((synth_quant)q), s.n_tensors,
           (unsigned long long)s.n_bytes, s.seconds,
           s.seconds > 0 ? (double)s.n_bytes / s.seconds / 1e9 : 0.0, s.n_threads, o.output);
    return 0;
}
