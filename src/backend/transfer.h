// The host ↔ device seams of the models and the pipeline. The models' entry points take inputs
// from the host (tests, the API's arrays) or already on the backend's device, and their results
// stay on the device until the pipeline brings them back; on the CPU backend every call here is
// a no-op that copies nothing.
#pragma once

#include <string>

#include "backend/backend.h"

namespace klein {

// `t` on the backend's device: `t` itself when it is there already (or is empty), else an
// uploaded copy kept in `tmp`.
inline Result<const Tensor*> on_device(Backend& be, const Tensor& t, Tensor& tmp, const std::string& what) {
  if (t.device() == be.device() || t.numel() == 0) return &t;
  KLEIN_ASSIGN_OR_RETURN(tmp, be.upload(t.data(), t.shape(), what));
  return &tmp;
}

// `t` in host memory: moved through when it is there already, else downloaded (same shape).
inline Result<Tensor> to_host(Backend& be, Tensor t) {
  if (t.device() == Device::kCpu) return t;
  KLEIN_ASSIGN_OR_RETURN(Tensor h, be.download(t.view()));
  KLEIN_RETURN_IF_ERROR(h.reshape(t.shape()));
  return h;
}

}  // namespace klein
