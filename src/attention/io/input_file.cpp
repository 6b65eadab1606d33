#include "io/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "attn/error.hpp"

namespace attn::io {

std::string file_kind(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

namespace {
[[noreturn]] void refuse(const std::string& path, unsigned mode) {
  fail(path, "is " + file_kind(mode) + ", not a regular file; attn reads inputs from regular files only");
}
}  // namespace

InputFile::InputFile(const std::string& path) : path_(path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) refuse(path, st.st_mode);
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const unsigned mode = st.st_mode;
    ::close(fd_);
    fd_ = -1;
    refuse(path, mode);
  }
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

size_t InputFile::read(void* dst, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd_, static_cast<char*>(dst) + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(path_, std::string("read failed: ") + std::strerror(errno));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

std::string read_text_file(const std::string& path, uint64_t max_bytes) {
  InputFile f(path);
  const std::string limit = std::to_string(max_bytes >> 20) + " MiB (" + std::to_string(max_bytes) + " bytes)";
  if (f.size() > max_bytes)
    fail(path, "holds " + std::to_string(f.size()) + " bytes, more than the " + limit + " a text may have");
  std::string text;
  char buf[1 << 16];
  for (;;) {  // bounded even when the size lied (a file that grows, /proc files that claim 0 bytes)
    const size_t n = f.read(buf, sizeof buf);
    if (n == 0) break;
    if (text.size() + n > max_bytes) fail(path, "is longer than the " + limit + " a text may have");
    text.append(buf, n);
  }
  return text;
}

}  // namespace attn::io
