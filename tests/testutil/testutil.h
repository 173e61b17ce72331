/* Shared helpers of the C tests: the reference model folder, temporary files, whole-file reads,
 * a seeded splitmix64 generator, and the CUnit runner tail every test main() ends with.
 * Test code: no status objects, failures are NULL returns or a non-zero exit. */
#ifndef DS_TESTS_TESTUTIL_TESTUTIL_H
#define DS_TESTS_TESTUTIL_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* The reference model folder (shared/reference, see its README.md): $DS_REFERENCE_DIR, else
 * $DS_REPO_ROOT/../shared/reference, else <repository found through the runfiles symlink of
 * tests/testutil/testutil.c (a data dependency of this library)>/../shared/reference, else
 * /work/shared/reference. Writes into out. */
void testutil_reference_dir(char *out, size_t cap);

/* $TEST_TMPDIR when set and non-empty, else "/tmp". */
const char *testutil_tmp_dir(void);

/* Whole file, malloc'd and NUL-terminated (the NUL not counted in *n); NULL on error. Reads
 * until EOF, so pipes and files that grow work too. n may be NULL. */
char *testutil_read_file(const char *path, size_t *n);

/* splitmix64: the next 64 random bits of the stream seeded by *s. */
uint64_t testutil_rng_next(uint64_t *s);
/* Uniform in [-1, 1), 24 random bits. */
float testutil_rng_uniform(uint64_t *s);
/* Standard normal (Box-Muller over two 53-bit uniforms). */
float testutil_rng_gauss(uint64_t *s);

/* Runs every registered CUnit suite (verbose), cleans up the registry and returns the exit
 * status of main(): 1 when any test, assertion or suite init/cleanup failed or the run itself
 * reported an error, else 0. Call after CU_initialize_registry() and the CU_add_* calls. */
int testutil_cunit_run(void);

#endif
