/* grpc_init for the rpc layer, with the process-wide settings of the libraries under it. */
#ifndef DS_RPC_RPC_INIT_H
#define DS_RPC_RPC_INIT_H

/* grpc_init(), pair it with grpc_shutdown(). The first call also turns off abseil's mutex
 * deadlock detection (absl::SetMutexDeadlockDetectionMode(kIgnore)): Debian builds abseil
 * without NDEBUG, where every absl::Mutex lock in gRPC updates a global lock-order graph; that
 * was about a tenth of the router's instructions per relayed message (docs/BENCH.md 3.8).
 * Upstream release builds have it off. Looked up by its symbol: where the library names it
 * differently, nothing changes. */
void rpc_init_grpc(void);

#endif
