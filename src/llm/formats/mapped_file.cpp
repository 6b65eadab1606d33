#include "formats/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "attn/error.hpp"
#include "io/input_file.hpp"

namespace attn::io {

MappedFile map_file(const std::string& path) {
  const InputFile in(path);  // regular files only: a FIFO or a device is refused, never waited on
  const int fd = in.fd();
  MappedFile f;
  f.size = static_cast<size_t>(in.size());
  void* map = nullptr;
  if (f.size > 0) {
    map = ::mmap(nullptr, f.size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      fail(path, std::string("cannot map: ") + std::strerror(errno));
    }
  }
  // `in` closes the file when it goes; the mapping stays valid
  const size_t size = f.size;
  f.mapping = std::shared_ptr<const void>(map, [size](const void* p) {
    if (p) ::munmap(const_cast<void*>(p), size);
  });
  static const uint8_t kEmpty = 0;
  f.data = map ? static_cast<const uint8_t*>(map) : &kEmpty;
  return f;
}

}  // namespace attn::io
