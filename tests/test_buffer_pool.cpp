// BufferPool (backend/buffer_pool.h): freed tensors' buffers are handed out again, best fit; a
// new buffer drops the idle smaller ones; tensors may outlive the pool.
#include <gtest/gtest.h>

#include <memory>
#include <optional>

#include "backend/buffer_pool.h"
#include "backend/cpu/cpu_backend.h"

namespace klein {
namespace {

TEST(BufferPool, FreedBufferIsReused) {
  CpuBackend be(CpuBackendOptions{1});
  BufferPool pool(be);
  auto a = pool.take({2, 3, 4}, "a");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(a->device(), Device::kCpu);
  const float* pa = a->data();
  a->data()[23] = 5.0f;  // the whole buffer is writable
  *a = Tensor();         // back to the pool
  EXPECT_EQ(pool.buffers(), 1);
  auto b = pool.take({4, 6}, "b");  // same size: the same buffer, contents as left
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), pa);
  EXPECT_EQ(b->data()[23], 5.0f);
  auto c = pool.take({24}, "c");  // the only buffer is in use: a new one
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->data(), pa);
  EXPECT_EQ(pool.buffers(), 2);
  EXPECT_EQ(pool.floats(), 48);
}

TEST(BufferPool, BestFitAndGrowth) {
  CpuBackend be(CpuBackendOptions{1});
  BufferPool pool(be);
  auto big = pool.take({100}, "big");
  auto small = pool.take({50}, "small");
  ASSERT_TRUE(big.ok() && small.ok());
  const float* pb = big->data();
  const float* ps = small->data();
  *big = Tensor();
  *small = Tensor();
  auto t = pool.take({40}, "t");  // both fit: the smaller one
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->data(), ps);
  auto u = pool.take({60}, "u");  // only the larger one fits
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->data(), pb);
  *t = Tensor();
  *u = Tensor();
  EXPECT_EQ(pool.buffers(), 2);
  auto g = pool.take({200}, "grown");  // none fits: a new buffer, the idle smaller ones dropped
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(pool.buffers(), 1);
  EXPECT_EQ(pool.floats(), 200);
}

TEST(BufferPool, MaxFitReusesOnlyCloseBuffers) {
  CpuBackend be(CpuBackendOptions{1});
  BufferPool pool(be, 1.25);
  auto big = pool.take({100}, "big");
  auto mid = pool.take({60}, "mid");
  ASSERT_TRUE(big.ok() && mid.ok());
  const float* pb = big->data();
  *big = Tensor();
  *mid = Tensor();
  auto close = pool.take({90}, "close");  // 100 ≤ 1.25 · 90: reused
  ASSERT_TRUE(close.ok());
  EXPECT_EQ(close->data(), pb);
  auto small = pool.take({20}, "small");  // 60 > 1.25 · 20: a new buffer, and the idle 60 released
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(pool.buffers(), 2);
  EXPECT_EQ(pool.floats(), 120);
}

TEST(BufferPool, TensorsOutliveThePool) {
  CpuBackend be(CpuBackendOptions{1});
  std::optional<Tensor> kept;
  {
    BufferPool pool(be);
    auto a = pool.take({1000}, "a");
    auto b = pool.take({10}, "b");
    ASSERT_TRUE(a.ok() && b.ok());
    kept = std::move(*a);
    *b = Tensor();  // idle when the pool goes: freed with it
  }
  kept->data()[999] = 1.0f;  // still valid memory (ASan would flag a use after free)
  kept.reset();              // freed now, not returned to a pool that is gone
}

TEST(BufferPool, TakeFromFallsBackToTheBackend) {
  CpuBackend be(CpuBackendOptions{1});
  BufferPool pool(be);
  auto fresh = BufferPool::take_from(nullptr, be, {8}, "fresh");
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->data()[7], 0.0f);  // the backend's zero-filled memory
  EXPECT_EQ(pool.buffers(), 0);
  auto pooled = BufferPool::take_from(&pool, be, {8}, "pooled");
  ASSERT_TRUE(pooled.ok());
  EXPECT_EQ(pool.buffers(), 1);
}

TEST(BufferPool, EmptyAndInvalidShapes) {
  CpuBackend be(CpuBackendOptions{1});
  BufferPool pool(be);
  auto e = pool.take({0, 5}, "empty");
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->empty());
  EXPECT_EQ(pool.buffers(), 0);
  auto bad = pool.take({-1, 5}, "the bad tensor");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().to_string().find("the bad tensor"), std::string::npos);
}

}  // namespace
}  // namespace klein
