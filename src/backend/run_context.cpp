#include "backend/run_context.h"

namespace klein {

void RunContext::dump(const std::string& name, const TensorView& x, const Shape& shape) const {
  if (!wants_dump(name)) return;
  const Shape s = shape.empty() ? x.shape_vec() : shape;
  // Dumps are for debugging: download (a copy on the CPU too when the view is strided).
  if (x.device == Device::kCpu && x.is_contiguous()) {
    dumper->dump(name, x.f32(), s);
    return;
  }
  auto host = backend->download(x);
  if (host.ok()) dumper->dump(name, host->data(), s);
}

}  // namespace klein
