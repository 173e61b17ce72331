#include "rpc/rpc_init.h"

#include <dlfcn.h>
#include <pthread.h>

#include <grpc/grpc.h>

/* absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle), in the inline namespace of
 * Debian's abseil 20220623; OnDeadlockCycle::kIgnore is 0 (an int-sized enum class). */
#define ABSL_SET_DEADLOCK_MODE "_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE"

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void settle(void)
{
    void (*set_mode)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, ABSL_SET_DEADLOCK_MODE);
    if (set_mode) set_mode(0);
}

void rpc_init_grpc(void)
{
    pthread_once(&once, settle);
    grpc_init();
}
