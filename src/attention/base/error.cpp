#include "attn/error.hpp"

namespace attn {

void fail(const std::string& where, const std::string& what) { throw Error(where + ": " + what); }

}  // namespace attn
