// Output files of one command, all or nothing (shared by attn run and attn mask).
#pragma once
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "attn/error.hpp"
#include "attn/npy.hpp"

namespace attn::cli {

// The output files of one run, all or nothing: each is written to a temporary file in its own
// directory and renamed over its path only when every one was written; on failure the
// temporaries are removed and existing files are left as they were. Paths that name an input
// or each other are refused before anything is computed.
class OutputFiles {
 public:
  OutputFiles(const std::vector<std::pair<std::string, std::string>>& inputs,
              const std::vector<std::pair<std::string, std::string>>& outputs) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      const auto& [flag, path] = outputs[i];
      if (path.empty()) continue;
      for (const auto& [iflag, ipath] : inputs)
        if (!ipath.empty() && same_file(path, ipath))
          fail(flag, "'" + path + "' is the input " + iflag + "; refusing to overwrite an input");
      for (size_t j = 0; j < i; ++j)
        if (!outputs[j].second.empty() && same_file(path, outputs[j].second))
          fail(flag, "'" + path + "' is also " + outputs[j].first + "; each output needs its own file");
    }
  }
  ~OutputFiles() {
    for (const auto& [tmp, final_path] : pending_) std::remove(tmp.c_str());
  }
  // Writes the array to a temporary file beside `path`.
  void write(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data) {
    write_npy(temporary_for(path), dtype, shape, data);
  }
  // Writes text (CSV, JSON, SVG) to a temporary file beside `path`.
  void write_text(const std::string& path, const std::string& text) {
    const std::string tmp = temporary_for(path);
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0)
      fail(path, std::string("cannot write it: ") + std::strerror(errno));
  }
  // Renames every temporary over its path.
  void commit() {
    for (const auto& [tmp, final_path] : pending_)
      if (std::rename(tmp.c_str(), final_path.c_str()) != 0)
        fail(final_path, std::string("cannot replace it: ") + std::strerror(errno));
    pending_.clear();
  }

 private:
  std::string temporary_for(const std::string& path) {
    std::string tmp = path + ".attn-tmp-XXXXXX";
    const int fd = mkstemp(tmp.data());
    if (fd < 0) fail(path, std::string("cannot create a file beside it: ") + std::strerror(errno));
    const mode_t mask = umask(0);  // mkstemp makes 0600 files; give the usual 0666 & ~umask
    umask(mask);
    fchmod(fd, 0666 & ~mask);
    close(fd);
    pending_.emplace_back(tmp, path);
    return tmp;
  }
  static bool same_file(const std::string& a, const std::string& b) {
    std::error_code ec;
    if (std::filesystem::equivalent(a, b, ec)) return true;  // existing files, links included
    return std::filesystem::weakly_canonical(a, ec) == std::filesystem::weakly_canonical(b, ec);
  }
  std::vector<std::pair<std::string, std::string>> pending_;  // (temporary, final path)
};

}  // namespace attn::cli
