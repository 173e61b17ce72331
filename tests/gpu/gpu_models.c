/* The GPU tests' model files (gpu_models.h). */
#include "tests/gpu/gpu_models.h"

#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/status.h"

void gpu_models_load(gpu_models *g, const char *path, const char *name)
{
    status st;
    if (access(path, R_OK) != 0) {
        printf("  %s absent: not run\n", path);
        return;
    }
    if (g->n >= GPU_MODELS_MAX) {
        CU_FAIL("gpu_models: too many models");
        return;
    }
    if (qwen35_model_load(&g->m[g->n], path, &st)) {
        printf("  %s: %s\n", path, st.msg);
        CU_FAIL("model load");
        return;
    }
    g->name[g->n++] = name;
}

void gpu_models_demo_path(char *path, size_t n)
{
    const char *root = getenv("DS_REPO_ROOT");
    snprintf(path, n, "models/demo-en-17m.gguf");
    if (access(path, R_OK) != 0 && root) snprintf(path, n, "%s/models/demo-en-17m.gguf", root);
}

void gpu_models_free(gpu_models *g)
{
    for (int i = 0; i < g->n; i++) qwen35_model_free(g->m[i]);
    g->n = 0;
}
