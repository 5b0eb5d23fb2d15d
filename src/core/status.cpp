#include "klein/status.h"

#include <cstdio>
#include <cstdlib>

namespace klein {

const char* code_name(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kNotFound: return "not found";
    case Code::kIoError: return "i/o error";
    case Code::kFormatError: return "format error";
    case Code::kUnsupported: return "unsupported";
    case Code::kCancelled: return "cancelled";
    case Code::kOutOfMemory: return "out of memory";
    case Code::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  // An out-of-memory message already begins "out of memory: ...".
  if (code_ == Code::kOutOfMemory && message_.starts_with("out of memory")) return message_;
  return std::string(code_name(code_)) + ": " + message_;
}

void result_value_on_error(const Status& s) {
  std::fprintf(stderr, "klein: Result::value() called on an error: %s\n", s.to_string().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace klein
