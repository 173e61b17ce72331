/* The tail of every CUnit test main(): run, count what failed, clean up. */
#include <CUnit/Basic.h>

#include "tests/testutil/testutil.h"

int testutil_cunit_run(void)
{
    CU_basic_set_mode(CU_BRM_VERBOSE);
    int failed = CU_basic_run_tests() != CUE_SUCCESS;
    /* A failed suite init leaves its tests unrun: it counts as a failure too. */
    failed |= CU_get_number_of_tests_failed() > 0 || CU_get_number_of_failures() > 0 ||
              CU_get_number_of_suites_failed() > 0;
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
