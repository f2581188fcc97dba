// Signature check stub (tests/torch_headers/README.md), not PyTorch: the declarations the adapter
// uses of c10/util/Exception.h, trimmed. They are the same in every interface checked here (read
// from the 2.1-era header and a recent main): c10::Error with its SourceLocation constructor,
// c10::OutOfMemoryError deriving from it (Python: torch.cuda.OutOfMemoryError), and the
// TORCH_CHECK / TORCH_CHECK_WITH(error_t, cond, ...) macros, which throw
// ::c10::error_t({__func__, __FILE__, __LINE__}, c10::str(args...)) when cond is false (PyTorch's
// TORCH_CHECK goes through c10::detail::torchCheckFail, which throws c10::Error the same way).
// Both classes carry C10_API, as in PyTorch; Error's constructor and what(), and (as 2.14 declares
// it; 2.6 inherits Error's) OutOfMemoryError's constructor are defined by libc10, here by
// run/fake_torch.cpp.
#pragma once
#include <exception>
#include <string>

#include <c10/macros/Export.h>
#include <c10/util/StringUtil.h>

namespace c10 {

class C10_API Error : public std::exception {
  std::string msg_;

 public:
  Error(SourceLocation source_location, std::string msg);
  const std::string& msg() const {
    return msg_;
  }
  const char* what() const noexcept override;
  virtual const char* what_without_backtrace() const noexcept {
    return msg_.c_str();
  }
};

class C10_API OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(SourceLocation source_location, std::string msg);
};

} // namespace c10

#define C10_THROW_ERROR(err_type, msg) \
  throw ::c10::err_type(               \
      {__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg)

#define TORCH_CHECK_WITH(error_t, cond, ...) \
  if (!(cond)) {                             \
    C10_THROW_ERROR(error_t, ::c10::str(__VA_ARGS__)); \
  }

#define TORCH_CHECK(cond, ...) TORCH_CHECK_WITH(Error, cond, __VA_ARGS__)
