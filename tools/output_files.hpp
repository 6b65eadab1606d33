// Output files of one command, all or nothing (shared by attn run and attn mask).
#pragma once
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <map>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attn/error.hpp"
#include "attn/npy.hpp"
#include "io/npy_header.hpp"
#include "io/output_file.hpp"

namespace attn::cli {

// When `path` is this process's standard output (/dev/stdout, /proc/self/fd/1, or the file or
// pipe stdout goes to; not a terminal or /dev/null), the data gets it: stdout's file is kept on a new descriptor, whose
// /proc/self/fd path is returned for writing, and stdout itself then goes to stderr, so that no
// message or table lands in the middle of the data. Any other path is returned as it is.
inline std::string claim_stdout(const std::string& path) {
  struct stat a {}, b {};
  if (path.empty() || ::stat(path.c_str(), &a) != 0 || ::fstat(STDOUT_FILENO, &b) != 0) return path;
  if (a.st_dev != b.st_dev || a.st_ino != b.st_ino) return path;
  if (S_ISCHR(b.st_mode)) return path;  // a terminal or /dev/null: nothing to keep apart
  std::fflush(stdout);
  const int kept = ::dup(STDOUT_FILENO);
  if (kept < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) return path;
  return "/proc/self/fd/" + std::to_string(kept);
}

// The output files of one run, all or nothing. Every path is checked when this is made, before
// anything is computed (io::OutputFile::check: no directories, sockets or missing directories;
// no path naming an input or another output). write() puts each output in a temporary file
// beside its path (io::OutputFile; a device or FIFO is kept in memory instead); commit() fsyncs
// every temporary, then writes the devices and FIFOs in place, then renames the temporaries over
// their paths. On any failure before the renames the temporaries are removed and existing files
// are left as they were.
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
      if (std::string fd = claim_stdout(path); fd != path) renamed_[path] = fd;
      try {
        io::OutputFile::check(path);
      } catch (const Error& e) {
        fail(flag, e.what());
      }
    }
  }
  // Writes the array to a temporary file beside `path`.
  void write(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data) {
    size_t payload = 0;
    const std::string header = io::npy_header(path, dtype, shape, payload);
    io::OutputFile& f = open(path);
    f.write(header.data(), header.size());
    f.write(data, payload);
    f.finish();
  }
  // Writes text (CSV, JSON, SVG) to a temporary file beside `path`.
  void write_text(const std::string& path, const std::string& text) {
    io::OutputFile& f = open(path);
    f.write(text.data(), text.size());
    f.finish();
  }
  // Devices and FIFOs first (they may fail: /dev/full), then every rename.
  void commit() {
    for (auto& f : files_)
      if (f->in_place()) f->commit();
    for (auto& f : files_) f->commit();
    files_.clear();
  }

 private:
  io::OutputFile& open(const std::string& path) {
    const auto it = renamed_.find(path);
    return *files_.emplace_back(std::make_unique<io::OutputFile>(it == renamed_.end() ? path : it->second));
  }
  static bool same_file(const std::string& a, const std::string& b) {
    std::error_code ec;
    if (std::filesystem::equivalent(a, b, ec)) {
      // Two names of one character device (/dev/null as two outputs) are not one file's content.
      struct stat st {};
      return !(::stat(a.c_str(), &st) == 0 && S_ISCHR(st.st_mode));
    }
    return std::filesystem::weakly_canonical(a, ec) == std::filesystem::weakly_canonical(b, ec);
  }
  std::vector<std::unique_ptr<io::OutputFile>> files_;
  std::map<std::string, std::string> renamed_;  // stdout's path -> its kept descriptor's
};

}  // namespace attn::cli
