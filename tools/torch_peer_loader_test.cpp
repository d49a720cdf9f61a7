// The bench's PyTorch peer loader (bench/torch_peer_loader.cpp) against fake plugins: every
// way a plugin can fail to serve gives nullptr and a line naming the file and the reason,
// never a crash; a good one is returned as it is.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "bench/torch_peer.h"

namespace optx::bench {
namespace {

const TorchPeer* load_quiet(const std::string& path, std::string* err) {
  testing::internal::CaptureStderr();
  const TorchPeer* p = load_torch_peer(path);
  *err = testing::internal::GetCapturedStderr();
  return p;
}

TEST(TorchPeerLoader, MissingFileIsReportedNotFatal) {
  std::string err;
  EXPECT_EQ(load_quiet("/nonexistent/liboptx_torch_peer.so", &err), nullptr);
  EXPECT_NE(err.find("/nonexistent/liboptx_torch_peer.so did not load"), std::string::npos) << err;
  EXPECT_NE(err.find("no torch rows"), std::string::npos) << err;
}

TEST(TorchPeerLoader, LibraryWithoutTheEntryPointIsRefused) {
  std::string err;
  EXPECT_EQ(load_quiet("libm.so.6", &err), nullptr);
  EXPECT_NE(err.find("libm.so.6 is not a PyTorch peer of this optx (abi -1"), std::string::npos) << err;
}

TEST(TorchPeerLoader, OtherAbiIsRefused) {
  std::string err;
  EXPECT_EQ(load_quiet(FAKE_PEER_ABI0, &err), nullptr);
  EXPECT_NE(err.find("(abi 0, expected " + std::to_string(TorchPeer::kAbi) + ")"), std::string::npos) << err;
}

TEST(TorchPeerLoader, PluginOfThisAbiLoads) {
  std::string err;
  const TorchPeer* p = load_quiet(FAKE_PEER, &err);
  ASSERT_NE(p, nullptr) << err;
  EXPECT_TRUE(err.empty()) << err;
  EXPECT_STREQ(p->version, "fake");
  p->set_threads(3);
  void* h = dlopen(FAKE_PEER, RTLD_NOW | RTLD_NOLOAD);  // the plugin stays loaded: its table is in use
  ASSERT_NE(h, nullptr);
  const auto threads = reinterpret_cast<int (*)()>(dlsym(h, "optx_fake_torch_peer_threads"));
  ASSERT_NE(threads, nullptr);
  EXPECT_EQ(threads(), 3);
}

}  // namespace
}  // namespace optx::bench
