// Opening a file attn reads (weights, .npy arrays, texts): the one place that decides what may be
// read, so that no input can make a read wait forever or run until memory is gone.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace attn::io {

// Texts (tokenize --file, eval-ppl --text) are read whole, up to this many bytes.
inline constexpr uint64_t kMaxTextBytes = uint64_t{64} << 20;  // 64 MiB

// An open, regular file (closed when it goes).
class InputFile {
 public:
  // Opens `path` for reading. Anything but a regular file (a FIFO, a device such as /dev/zero, a
  // directory, a socket) is refused, naming the path and what it is: stat first, so that no
  // device is opened at all, then open with O_NONBLOCK, so that a FIFO swapped in since the stat
  // is never waited on, and fstat again. Error when it cannot be opened.
  explicit InputFile(const std::string& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }  // at open
  // Reads up to n bytes (fewer only at the end of the file); Error naming the path on a read error.
  size_t read(void* dst, size_t n);

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole of a text file, refused (naming the file and the limit) past `max_bytes`, whatever
// the file's size claims while it is read.
std::string read_text_file(const std::string& path, uint64_t max_bytes = kMaxTextBytes);

// "a FIFO", "a character device", "a directory", ... for st_mode.
std::string file_kind(unsigned mode);

}  // namespace attn::io
