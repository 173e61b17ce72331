/* Command-line configuration declared as one table: each flag has a name, an environment
 * variable fallback, a default, a kind and a help line. flags_parse fills the caller's struct
 * once at start-up; --help is generated from the table.
 *
 *   static const flag_spec specs[] = {
 *       {"model", "DS_MODEL", NULL, FLAG_STR, offsetof(opts, model), "GGUF model file"},
 *       {"max-tokens", "DS_MAX_TOKENS", "64", FLAG_INT, offsetof(opts, max_tokens), "..."},
 *       {0}};
 *   if (flags_parse(specs, &o, argc, argv, "deltaserve generate", &st)) { print st.msg; exit 2 }
 *
 * Precedence: command line > environment > default. FLAG_BOOL takes no value ("--print-ids")
 * and its env value is 1/0/true/false. Unknown flags and bad numbers are errors naming the
 * flag. Returns STATUS_CANCELLED (having printed help to stdout) when --help was given. */
#ifndef DS_COMMON_FLAGS_H
#define DS_COMMON_FLAGS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum flag_kind { FLAG_STR, FLAG_INT, FLAG_I64, FLAG_FLOAT, FLAG_BOOL } flag_kind;

typedef struct flag_spec {
    const char *name;      /* without the leading "--" */
    const char *env;       /* environment fallback, or NULL */
    const char *def;       /* default as text, or NULL (STR: NULL pointer; numbers: 0) */
    flag_kind kind;
    size_t offset;         /* into the options struct: const char *, int, int64_t, float, int */
    const char *help;
} flag_spec;

/* argv[0] is the subcommand name. Positional arguments are not accepted unless pos != NULL:
 * then they are stored (pointers into argv) in pos[0..*n_pos) up to max_pos. */
int flags_parse_pos(const flag_spec *specs, void *opts, int argc, char **argv, const char *usage,
                    const char **pos, int max_pos, int *n_pos, status *st);
int flags_parse(const flag_spec *specs, void *opts, int argc, char **argv, const char *usage,
                status *st);
/* A flag's value as a comma-separated list of integers, "1,16,64": the count stored in
 * out[0 .. max), 0 when malformed, empty, longer than max or a value outside [lo, hi]. */
int flags_int_list(const char *s, int *out, int max, int lo, int hi);

#endif
