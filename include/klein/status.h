// Status values for the library boundary: every fallible call returns Status or Result<T>.
// User input never aborts; it produces a Status with a one-line message naming what and where.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "klein/export.h"

namespace klein {

enum class Code {
  kOk = 0,
  kInvalidArgument,  // bad option or value given by the caller
  kNotFound,         // missing file, tensor or key
  kIoError,          // read/write/mmap failure
  kFormatError,      // malformed file contents (header, JSON, shapes, dtypes)
  kUnsupported,      // well-formed but not handled (unknown dtype, architecture)
  kCancelled,        // the caller's cancel callback asked to stop
  kOutOfMemory,      // an allocation failed; the message says how much and for what
  kInternal,         // a bug: an invariant of our own broke
};

KLEIN_API const char* code_name(Code c);

class Status;
// Prints "klein: Result::value() called on an error: <status>" to stderr and aborts.
[[noreturn]] KLEIN_API void result_value_on_error(const Status& s);

class [[nodiscard]] KLEIN_API Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "format error: model.safetensors: tensor 'x': ..." style one-liner.
  std::string to_string() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {Code::kNotFound, std::move(m)}; }
inline Status io_error(std::string m) { return {Code::kIoError, std::move(m)}; }
inline Status format_error(std::string m) { return {Code::kFormatError, std::move(m)}; }
inline Status unsupported(std::string m) { return {Code::kUnsupported, std::move(m)}; }
inline Status cancelled(std::string m) { return {Code::kCancelled, std::move(m)}; }
inline Status internal_error(std::string m) { return {Code::kInternal, std::move(m)}; }

// A value or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  // value() on an error is a bug in the caller: it aborts with the status message on stderr (in
  // every build; never undefined behaviour, never an exception). Check ok() first, or use value_or.
  T& value() & { check(); return *std::get_if<T>(&v_); }
  const T& value() const& { check(); return *std::get_if<T>(&v_); }
  T&& value() && { check(); return std::move(*std::get_if<T>(&v_)); }
  // The value, or `fallback` when there is none.
  T value_or(T fallback) const& { return ok() ? *std::get_if<T>(&v_) : std::move(fallback); }
  T value_or(T fallback) && { return ok() ? std::move(*std::get_if<T>(&v_)) : std::move(fallback); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  void check() const {
    if (!ok()) result_value_on_error(*std::get_if<Status>(&v_));
  }
  std::variant<T, Status> v_;
};

}  // namespace klein

#define KLEIN_CONCAT_INNER(a, b) a##b
#define KLEIN_CONCAT(a, b) KLEIN_CONCAT_INNER(a, b)

// Return the Status from the enclosing function if `expr` failed.
#define KLEIN_RETURN_IF_ERROR(expr)               \
  do {                                            \
    ::klein::Status klein_st_ = (expr);           \
    if (!klein_st_.ok()) return klein_st_;        \
  } while (0)

// `KLEIN_ASSIGN_OR_RETURN(auto x, f());` — unwrap a Result or return its Status.
#define KLEIN_ASSIGN_OR_RETURN(lhs, expr) \
  KLEIN_ASSIGN_OR_RETURN_IMPL(KLEIN_CONCAT(klein_res_, __LINE__), lhs, expr)
#define KLEIN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
