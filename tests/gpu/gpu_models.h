/* The model files the GPU tests read (tests/gpu): each loaded once, named, or said absent. */
#ifndef DS_TESTS_GPU_GPU_MODELS_H
#define DS_TESTS_GPU_GPU_MODELS_H

#include <stddef.h>

#include "model/qwen35.h"

#define GPU_MODELS_MAX 4

typedef struct gpu_models {
    int n;
    qwen35_model *m[GPU_MODELS_MAX];
    const char *name[GPU_MODELS_MAX];
} gpu_models;

/* Loads path as model `name` (a string that outlives g). An absent file prints "PATH absent:
 * not run" and loads nothing; one that fails to load prints why and fails the running CUnit
 * test. */
void gpu_models_load(gpu_models *g, const char *path, const char *name);
/* The demo model's path (models/demo-en-17m.gguf): here, else under $DS_REPO_ROOT. */
void gpu_models_demo_path(char *path, size_t n);
void gpu_models_free(gpu_models *g);

#endif
