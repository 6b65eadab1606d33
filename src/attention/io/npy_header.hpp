// The bytes a .npy file starts with (shared by write_npy and the CLI's all-or-nothing outputs).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "attn/dtype.hpp"

namespace attn::io {

// Magic, version 1.0, header length and the padded header dict for a C-order array; `payload`
// gets the bytes that must follow. Error naming `path` for a dtype .npy cannot hold here.
std::string npy_header(const std::string& path, DType dtype, const std::vector<int64_t>& shape, size_t& payload);

}  // namespace attn::io
