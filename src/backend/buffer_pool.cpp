#include "backend/buffer_pool.h"

#include <mutex>
#include <utility>
#include <vector>

#include "core/checked.h"

namespace klein {

struct BufferPool::State {
  std::mutex mu;
  bool open = true;          // false once the BufferPool is gone: returned buffers are freed
  std::vector<Tensor> idle;  // flat [capacity] buffers not handed out
  int in_use = 0;
  int64_t in_use_floats = 0;
};

namespace {

// What a handed-out tensor's release callback gets back: its buffer and the pool's state.
struct Lease {
  std::shared_ptr<BufferPool::State> state;
  Tensor buf;
};

void give_back(void* /*data*/, void* ctx) {
  std::unique_ptr<Lease> lease(static_cast<Lease*>(ctx));
  BufferPool::State& s = *lease->state;
  std::lock_guard<std::mutex> lock(s.mu);
  --s.in_use;
  s.in_use_floats -= lease->buf.numel();
  if (s.open) s.idle.push_back(std::move(lease->buf));
}

}  // namespace

BufferPool::BufferPool(Backend& be, double max_fit) : be_(be), max_fit_(max_fit), state_(std::make_shared<State>()) {}

BufferPool::~BufferPool() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->open = false;
  state_->idle.clear();
}

Result<Tensor> BufferPool::take(const Shape& shape, const std::string& what) {
  int64_t n = 0;
  if (!checked_numel(shape, &n) || n == 0) return be_.alloc(shape, what);  // its message for a bad shape
  Tensor buf;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto& idle = state_->idle;
    auto fits = [&](const Tensor& t) {
      return t.numel() >= n && (max_fit_ <= 0 || static_cast<double>(t.numel()) <= max_fit_ * static_cast<double>(n));
    };
    size_t best = idle.size();
    for (size_t i = 0; i < idle.size(); ++i)
      if (fits(idle[i]) && (best == idle.size() || idle[i].numel() < idle[best].numel())) best = i;
    if (best < idle.size()) {
      buf = std::move(idle[best]);
      idle.erase(idle.begin() + static_cast<std::ptrdiff_t>(best));
    } else if (max_fit_ > 0) {
      idle.clear();
    } else {
      std::erase_if(idle, [&](const Tensor& t) { return t.numel() < n; });
    }
  }
  if (buf.empty()) {
    KLEIN_ASSIGN_OR_RETURN(buf, be_.alloc({n}, what));
  }
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    ++state_->in_use;
    state_->in_use_floats += buf.numel();
  }
  auto* lease = new Lease{state_, std::move(buf)};
  float* data = lease->buf.data();
  return Tensor::adopt(data, shape, lease->buf.device(), give_back, lease);
}

Result<Tensor> BufferPool::take_from(BufferPool* pool, Backend& be, const Shape& shape, const std::string& what) {
  return pool ? pool->take(shape, what) : be.alloc(shape, what);
}

int BufferPool::buffers() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->in_use + static_cast<int>(state_->idle.size());
}

int64_t BufferPool::floats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  int64_t f = state_->in_use_floats;
  for (const Tensor& t : state_->idle) f += t.numel();
  return f;
}

}  // namespace klein
