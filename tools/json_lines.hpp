// A JSON-lines file written one line per finished case (attn bench --json), so that an
// interrupted run keeps every case it finished.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "attn/error.hpp"
#include "io/output_file.hpp"
#include "output_files.hpp"

namespace attn::cli {

// The path is checked and opened when this is made (before any case runs): a directory, a block
// device or a socket is refused, a FIFO without a reader too (never waited on). An existing
// regular file is left as it was until the first line is ready, and is then replaced (truncated)
// by this run's lines: a run stopped before its first case loses nothing, and a finished one
// holds exactly its own cases. Each line goes to the file with its own write (no buffering in
// the process), so Ctrl-C loses no finished case; every write error is an Error naming `flag`.
class JsonLines {
 public:
  JsonLines(const std::string& flag, const std::string& path) : flag_(flag), path_(path) {
    if (path.empty()) return;
    try {
      io::OutputFile::check(path);
    } catch (const Error& e) {
      fail(flag, e.what());
    }
    const std::string at = claim_stdout(path);  // --json /dev/stdout: the table goes to stderr
    fd_ = ::open(at.c_str(), O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno == ENXIO) fail(flag, "'" + path + "' is a FIFO with no reader; attn does not wait for one");
    if (fd_ < 0) fail(flag, "cannot open '" + path + "' for writing: " + std::strerror(errno));
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  }
  ~JsonLines() {
    if (fd_ >= 0) ::close(fd_);
  }
  JsonLines(const JsonLines&) = delete;
  JsonLines& operator=(const JsonLines&) = delete;
  explicit operator bool() const { return fd_ >= 0; }

  void line(const std::string& text) {
    if (fd_ < 0) return;
    if (!started_) {
      struct stat st {};
      if (::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode) && ::ftruncate(fd_, 0) != 0)
        fail(flag_, "cannot truncate '" + path_ + "': " + std::strerror(errno));
      started_ = true;
    }
    const std::string l = text + "\n";
    try {
      io::write_all(fd_, l.data(), l.size(), path_);
    } catch (const Error& e) {
      fail(flag_, e.what());
    }
  }
  // Closes the file, reporting a deferred write error (NFS reports some only here).
  void close() {
    if (fd_ < 0) return;
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(flag_, "cannot close '" + path_ + "': " + std::strerror(errno));
  }

 private:
  std::string flag_, path_;
  int fd_ = -1;
  bool started_ = false;
};

}  // namespace attn::cli
