// Signature check stub (tests/torch_headers/README.md), not PyTorch: what the adapter's error
// macros need of c10/util/StringUtil.h (SourceLocation, c10::str), trimmed. c10::str concatenates
// its arguments with operator<<, as PyTorch's does (which returns the argument itself for a
// single C string; the stub always builds a std::string).
#pragma once
#include <cstdint>
#include <sstream>
#include <string>

namespace c10 {

struct SourceLocation {
  const char* function;
  const char* file;
  uint32_t line;
};

template <typename... Args>
inline std::string str(const Args&... args) {
  std::ostringstream ss;
  (void)(ss << ... << args);
  return ss.str();
}

} // namespace c10
