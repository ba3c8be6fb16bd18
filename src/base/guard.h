#pragma once

#include <exception>
#include <new>
#include <string>

#include "distckpt/status.h"

namespace distckpt::internal_base {

// Runs a local step of a collective operation and turns any exception (bad_alloc from
// a large buffer, a library throwing) into a Status, so that the rank still reaches
// the next agreement instead of unwinding past it while the others wait.
template <typename F>
auto guarded(const std::string& where, F&& step) -> decltype(step()) {
  try {
    return step();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kIoError, where + ": out of memory");
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, where + ": unexpected exception: " + e.what());
  }
}

}  // namespace distckpt::internal_base
