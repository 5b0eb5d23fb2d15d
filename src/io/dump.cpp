#include "io/dump.h"

#include "io/npy.h"

namespace klein {

Dumper::Dumper(std::filesystem::path dir, std::string filter)
    : enabled_(!dir.empty()), dir_(std::move(dir)), filter_(std::move(filter)) {
  if (!enabled_) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    status_ = io_error(dir_.string() + ": cannot create dump folder (" + ec.message() + ")");
    enabled_ = false;
  }
}

bool Dumper::wants(std::string_view name) const {
  if (!enabled_) return false;
  if (filter_.empty()) return true;
  size_t b = 0;
  while (b <= filter_.size()) {
    size_t e = filter_.find(',', b);
    if (e == std::string::npos) e = filter_.size();
    std::string_view part(filter_.data() + b, e - b);
    if (!part.empty() && name.find(part) != std::string_view::npos) return true;
    b = e + 1;
  }
  return false;
}

void Dumper::dump(const std::string& name, const float* data, const Shape& shape) {
  if (!wants(name)) return;
  Status s = write_npy(dir_ / (name + ".npy"), DType::kF32, shape, data);
  if (!s.ok() && status_.ok()) status_ = s;
}

}  // namespace klein
