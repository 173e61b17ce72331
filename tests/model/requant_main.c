/* requant SRC DST KIND: writes a quantised copy of a GGUF (KIND: q8_0, q4_k_m, or one type for
 * every quantisable weight: f32 f16 bf16 q4_k q5_k q6_k). See gguf_rewrite.h. */
#include <stdio.h>
#include <string.h>

#include "gguf/quant.h"
#include "gguf_rewrite.h"

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: requant SRC DST q8_0|q4_k_m|f32|f16|bf16|q4_k|q5_k|q6_k\n");
        return 2;
    }
    static const struct { const char *name; requant_kind kind; uint32_t type; } kinds[] = {
        {"q8_0", REQUANT_Q8_0, 0},           {"q4_k_m", REQUANT_Q4_K_M, 0},
        {"f32", REQUANT_ALL, GGML_TYPE_F32}, {"f16", REQUANT_ALL, GGML_TYPE_F16},
        {"bf16", REQUANT_ALL, GGML_TYPE_BF16}, {"q4_k", REQUANT_ALL, GGML_TYPE_Q4_K},
        {"q5_k", REQUANT_ALL, GGML_TYPE_Q5_K}, {"q6_k", REQUANT_ALL, GGML_TYPE_Q6_K},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (strcmp(argv[3], kinds[i].name)) continue;
        status st;
        if (requant_file(argv[1], argv[2], kinds[i].kind, kinds[i].type, &st)) {
            fprintf(stderr, "requant: %s\n", st.msg);
            return 1;
        }
        return 0;
    }
    fprintf(stderr, "requant: unknown kind '%s'\n", argv[3]);
    return 2;
}
