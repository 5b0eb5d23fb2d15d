// The API boundary's catch-all: no exception leaves a public function. An allocation failure
// becomes Code::kOutOfMemory, anything else Code::kInternal with the exception's text.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "core/status.h"

namespace klein::api {

// The Status for the exception being handled (call only inside a catch block).
inline Status status_from_current_exception(const char* where) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return Status(Code::kOutOfMemory, std::string("out of memory: ") + where + ": an allocation failed");
  } catch (const std::exception& e) {
    return internal_error(std::string(where) + ": unexpected exception: " + e.what());
  } catch (...) {
    return internal_error(std::string(where) + ": unexpected non-standard exception");
  }
}

// Runs f() (returning Status or Result<T>) and turns any exception into its Status.
template <class F>
auto guarded(const char* where, F&& f) noexcept -> decltype(f()) {
  try {
    return f();
  } catch (...) {
    try {
      return status_from_current_exception(where);
    } catch (...) {  // building the message itself failed: no memory left at all
      return Status(Code::kOutOfMemory, std::string());
    }
  }
}

}  // namespace klein::api
