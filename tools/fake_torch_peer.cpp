// A stand-in for liboptx_torch_peer.so in the loader's test (torch_peer_loader_test.cpp):
// the real entry point and table, with the ABI number FAKE_ABI and no PyTorch behind it.
#include "bench/torch_peer.h"

namespace {
int g_threads = 0;
const char* describe(const char*) { return "fake"; }
void set_threads(int threads) { g_threads = threads; }
}  // namespace

extern "C" const optx::bench::TorchPeer* optx_torch_peer() {
  static const optx::bench::TorchPeer p{.abi = FAKE_ABI, .version = "fake", .describe = describe, .set_threads = set_threads};
  return &p;
}

// What the last set_threads call asked for (the test reads it through dlsym).
extern "C" int optx_fake_torch_peer_threads() { return g_threads; }
