#include "io/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "attn/error.hpp"
#include "io/input_file.hpp"

namespace attn::io {
namespace fs = std::filesystem;

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(path, std::string("write failed: ") + (w < 0 ? std::strerror(errno) : "no progress"));
    p += w, n -= static_cast<size_t>(w);
  }
}

namespace {

std::string error_text() { return std::strerror(errno); }

// Follows the symbolic links at `path` by hand: the file they end at, or "" when a link lies in
// /proc or /dev (/dev/stdout, /proc/self/fd/N stand for open files, not for names to replace).
std::string link_target(const std::string& path) {
  fs::path p = path;
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec))) return p.string();
    const std::string s = fs::absolute(p, ec).lexically_normal().string();
    if (s.rfind("/proc/", 0) == 0 || s.rfind("/dev/", 0) == 0) return "";
    const fs::path t = fs::read_symlink(p, ec);
    if (ec) return p.string();
    p = (t.is_absolute() ? t : p.parent_path() / t).lexically_normal();
  }
  fail(path, "has too many levels of symbolic links");
}

struct Plan {
  std::string target;  // where the temporary goes and is renamed to ("" in place)
  bool exists = false, in_place = false;
  struct stat st {};
};

Plan plan(const std::string& path) {
  if (path.empty()) fail("output", "the path is empty");
  Plan p;
  p.target = link_target(path);
  p.exists = ::stat(path.c_str(), &p.st) == 0;
  if (p.target.empty() && !p.exists) fail(path, "is a link into /proc or /dev that leads nowhere");
  if (p.exists && S_ISDIR(p.st.st_mode)) fail(path, "is a directory; give a file name");
  if (p.exists && (S_ISBLK(p.st.st_mode) || S_ISSOCK(p.st.st_mode)))
    fail(path, "is " + file_kind(p.st.st_mode) + "; attn writes regular files, FIFOs and character devices only");
  p.in_place = p.exists && (p.target.empty() || S_ISFIFO(p.st.st_mode) || S_ISCHR(p.st.st_mode));
  return p;
}

}  // namespace

void OutputFile::check(const std::string& path) {
  const Plan p = plan(path);
  if (p.in_place) return;
  const fs::path dir = fs::path(p.target).parent_path();
  if (::access(dir.empty() ? "." : dir.c_str(), W_OK | X_OK) != 0)
    fail(path, "cannot create a file beside it: " + error_text());
}

OutputFile::OutputFile(const std::string& path) : path_(path) {
  const Plan p = plan(path);
  target_ = p.target;
  in_place_ = p.in_place;
  const bool exists = p.exists;
  const struct stat& st = p.st;
  if (in_place_) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0 && errno == ENXIO) fail(path, "is a FIFO with no reader; attn does not wait for one");
    if (fd_ < 0) fail(path, "cannot open it for writing: " + error_text());
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
    return;
  }
  tmp_ = target_ + ".attn-tmp-XXXXXX";
  fd_ = ::mkstemp(tmp_.data());
  if (fd_ < 0) {
    tmp_.clear();
    fail(path, "cannot create a file beside it: " + error_text());
  }
  // mkstemp makes 0600 files: keep the mode of the file replaced, or give the usual 0666 & ~umask
  mode_t mode = 0;
  if (exists) {
    mode = st.st_mode & 07777;
  } else {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  ::fchmod(fd_, mode);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty() && !committed_) std::remove(tmp_.c_str());
}

void OutputFile::write(const void* data, size_t n) {
  if (in_place_) {
    pending_.append(static_cast<const char*>(data), n);
    return;
  }
  if (fd_ < 0) fail(path_, "written after it was finished");
  write_all(fd_, data, n, path_);
}

void OutputFile::finish() {
  if (in_place_ || fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    const std::string err = error_text();
    ::close(fd);
    fail(path_, "cannot flush it to disk: " + err);
  }
  if (::close(fd) != 0) fail(path_, "cannot close it: " + error_text());
}

void OutputFile::commit() {
  if (committed_) return;
  if (in_place_) {
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode) && ::ftruncate(fd_, 0) != 0)
      fail(path_, "cannot truncate it: " + error_text());
    write_all(fd_, pending_.data(), pending_.size(), path_);
    pending_.clear();
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(path_, "cannot close it: " + error_text());
    committed_ = true;
    return;
  }
  finish();
  if (std::rename(tmp_.c_str(), target_.c_str()) != 0) fail(path_, "cannot replace it: " + error_text());
  committed_ = true;
}

}  // namespace attn::io
