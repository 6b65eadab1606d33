// Writing a file attn makes (.npy outputs, tables, weights): what was at the path stays until the
// new content is whole, and device nodes or FIFOs are written, never replaced.
#pragma once
#include <cstddef>
#include <string>

namespace attn::io {

// One output file, in one of two modes decided (and checked) when it is made, before anything
// is computed:
// - nothing at the path, or a regular file (also at the end of symbolic links): the content goes
//   to a temporary file beside it; commit() renames that over the path after finish() flushed
//   and fsync'ed it, so a full disk is an error and the old file stays as it was;
// - a FIFO or a character device (/dev/null, a terminal, /dev/stdout and anything else reached
//   through /dev or /proc links): opened now, a FIFO without a reader refused rather than waited
//   on, and written in place by commit(); it is never renamed over.
// A directory, a block device or a socket is refused. Every write, flush, fsync and close error
// is an Error naming the path.
class OutputFile {
 public:
  explicit OutputFile(const std::string& path);
  // The checks of the constructor without creating or opening anything (a FIFO is not opened:
  // its reader would see the end of the data), so that every output of a command can be checked
  // before it computes: Error naming the path for a directory, a block device, a socket, a
  // missing or unwritable directory.
  static void check(const std::string& path);
  ~OutputFile();  // removes a temporary that was not committed
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  bool in_place() const { return in_place_; }
  const std::string& path() const { return path_; }
  void write(const void* data, size_t n);  // in place: kept until commit()
  void finish();                           // the temporary on disk (fsync) and closed
  void commit();                           // in place: written now; otherwise renamed over the path

 private:
  std::string path_, target_, tmp_, pending_;
  int fd_ = -1;
  bool in_place_ = false, committed_ = false;
};

// Writes `n` bytes to `fd` (short writes and EINTR retried); Error naming `path` on failure.
void write_all(int fd, const void* data, size_t n, const std::string& path);

}  // namespace attn::io
