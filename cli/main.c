/* deltaserve: one binary, one subcommand per job (docs/ARCHITECTURE.md §1). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} subcommand;

static const subcommand gguf_cmds[] = {
    {"info", cmd_gguf_info, "print a GGUF file's architecture, metadata and tensor table"},
    {"synth", cmd_gguf_synth, "write a synthetic Qwen3.5 GGUF of any size and quantization"},
    {NULL, NULL, NULL},
};

static int cmd_gguf(int argc, char **argv);

static const subcommand cmds[] = {
    {"worker", cmd_worker, "serve deltaserve.v1.Worker on one device (CPU or GPU)"},
    {"router", cmd_router, "serve the public deltaserve.v1.Generation API over workers"},
    {"client", cmd_client, "stream a generation from a router or worker"},
    {"generate", cmd_generate, "generate text locally (no server)"},
    {"eval", cmd_eval, "run token ids teacher-forced and write the logits"},
    {"tokenize", cmd_tokenize, "print the token ids of a text as JSON"},
    {"detokenize", cmd_detokenize, "print the text of token ids"},
    {"bench", cmd_bench, "decode / prefill / serving benchmarks"},
    {"gguf", cmd_gguf, "inspect or synthesise GGUF files (info, synth)"},
    {"version", cmd_version, "backends linked; whether cuBLAS and NCCL load (dense path, --tp)"},
    {NULL, NULL, NULL},
};

static void usage(const char *prefix, const subcommand *table)
{
    printf("usage: %s <command> [flags]   (%s <command> --help for its flags)\n\ncommands:\n",
           prefix, prefix);
    for (const subcommand *c = table; c->name; c++)
        printf("  %-12s %s\n", c->name, c->help);
}

static int dispatch(const char *prefix, const subcommand *table, int argc, char **argv)
{
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h") ||
        !strcmp(argv[0], "help")) {
        usage(prefix, table);
        return argc < 1 ? 2 : 0;
    }
    for (const subcommand *c = table; c->name; c++)
        if (!strcmp(argv[0], c->name)) return c->run(argc, argv);
    fprintf(stderr, "%s: unknown command '%s' (see %s --help)\n", prefix, argv[0], prefix);
    return 2;
}

static int cmd_gguf(int argc, char **argv)
{
    return dispatch("deltaserve gguf", gguf_cmds, argc - 1, argv + 1);
}

int main(int argc, char **argv)
{
    return dispatch("deltaserve", cmds, argc - 1, argv + 1);
}
