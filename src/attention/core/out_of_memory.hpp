// Allocation failure is the library's error, not the end of the process. Parallel regions never
// allocate (scratch is sized before them: base/parallel.hpp), so std::bad_alloc can only reach
// the calling thread; each public entry point catches it (a function-try-block) and calls this.
#pragma once
#include <new>  // std::bad_alloc, which the entry points catch

#include "attn/attend.hpp"

namespace attn::core {

// Throws Error("<where>: out of memory while <doing> <mechanism> on q <shape>").
[[noreturn]] void fail_out_of_memory(const char* where, const char* doing, const Mechanism& mechanism,
                                     const TensorView& q);

}  // namespace attn::core
