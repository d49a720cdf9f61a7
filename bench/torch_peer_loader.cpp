// Loads the PyTorch peer plugin for `optx bench` (see torch_peer.h).
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/torch_peer.h"

namespace optx::bench {
namespace {

std::string beside_executable(const char* name) {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return name;
  std::string dir(exe, size_t(n));
  return dir.substr(0, dir.find_last_of('/') + 1) + name;
}

}  // namespace

const TorchPeer* load_torch_peer(const std::string& path) {
  // RTLD_DEEPBIND: PyTorch's MKL exports the BLAS names (sgemm_, ...) that OpenBLAS,
  // already in the process for its own peer rows, defines too; bound globally, PyTorch's
  // calls would run OpenBLAS. Deep binding makes the plugin's libraries prefer their own.
  // (AddressSanitizer refuses RTLD_DEEPBIND outright, so its builds bind globally.)
#ifdef __SANITIZE_ADDRESS__
  constexpr int kDeep = 0;
#else
  constexpr int kDeep = RTLD_DEEPBIND;
#endif
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | kDeep);
  if (!h) {
    std::fprintf(stderr, "optx bench: the PyTorch peer %s did not load (%s): no torch rows\n", path.c_str(), dlerror());
    return nullptr;
  }
  const auto entry = reinterpret_cast<TorchPeerEntry>(dlsym(h, "optx_torch_peer"));
  const TorchPeer* peer = entry ? entry() : nullptr;
  if (!peer || peer->abi != TorchPeer::kAbi) {
    std::fprintf(stderr, "optx bench: %s is not a PyTorch peer of this optx (abi %d, expected %d): no torch rows\n", path.c_str(),
                 peer ? peer->abi : -1, TorchPeer::kAbi);
    return nullptr;
  }
  return peer;
}

const TorchPeer* torch_peer(int threads) {
  static const TorchPeer* const peer = [] () -> const TorchPeer* {
    const char* env = std::getenv("OPTX_TORCH_PEER");
    if (env && *env) return load_torch_peer(env);
    const std::string beside = beside_executable("liboptx_torch_peer.so");
    return access(beside.c_str(), F_OK) == 0 ? load_torch_peer(beside) : nullptr;  // absent: built without the peer
  }();
  if (peer) peer->set_threads(threads);
  return peer;
}

}  // namespace optx::bench
