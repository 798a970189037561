// The GPU runtime: availability is reported (never a crash) without a GPU; the arena hands out
// aligned, bounded memory and refuses with a clear message when full; streams order work.
#include "gpu/runtime.h"

#include <gtest/gtest.h>

#include "gpu/device.h"
#include "tests/gpu/gpu_test_util.h"

namespace troupe::gpu {
namespace {

TEST(GpuRuntime, AvailabilityIsReportedWithAReason) {
  std::string why;
  const bool ok = gpu_available(&why);
  std::string why2;
  const auto devices = list_devices(&why2);
  EXPECT_EQ(ok, !devices.empty());
  if (!ok) {
    EXPECT_FALSE(why.empty());
    EXPECT_FALSE(why2.empty());
  }
}

TEST(GpuRuntime, ArenaAlignsAndRefusesWhenFull) {
  TROUPE_REQUIRE_GPU();
  Arena arena(1 << 20);
  char* a = static_cast<char*>(arena.allocate(10, "a"));
  char* b = static_cast<char*>(arena.allocate(300, "b"));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(b - a, 256);
  const size_t m = arena.mark();
  arena.allocate(1000, "c");
  arena.rewind(m);
  EXPECT_EQ(arena.used(), m);
  try {
    arena.allocate(2 << 20, "kv pool");
    FAIL() << "allocation beyond the arena succeeded";
  } catch (const DeviceError& e) {
    EXPECT_EQ(e.code(), Errc::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("kv pool"), std::string::npos) << e.what();
  }
}

TEST(GpuRuntime, BufferRoundTripAndPoison) {
  TROUPE_REQUIRE_GPU();
  DeviceBuffer<float> buf(1000);
  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f;
  buf.upload(host);
  EXPECT_EQ(buf.download(), host);
  buf.fill_bytes(0xFF);
  for (float x : buf.download()) ASSERT_TRUE(std::isnan(x));
  StreamPair streams;
  streams.comm_waits_for_compute();
  streams.compute_waits_for_comm();
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(streams.compute()));
}

}  // namespace
}  // namespace troupe::gpu
