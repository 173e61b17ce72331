/* Subcommands of the one deltaserve binary. Each returns the process exit status:
 * 0 ok, 1 runtime failure (one line on stderr saying what and where), 2 usage error. */
#ifndef DS_CLI_CLI_H
#define DS_CLI_CLI_H

int cmd_gguf_info(int argc, char **argv);
int cmd_gguf_synth(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_worker(int argc, char **argv);
int cmd_router(int argc, char **argv);
int cmd_client(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_batch(int argc, char **argv); /* bench batch (cmd_bench_batch.c) */
int cmd_version(int argc, char **argv);

#endif
