#include "io/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "attn/error.hpp"

namespace attn::io {

MappedFile map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "is not a regular file");
  }
  MappedFile f;
  f.size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (f.size > 0) {
    map = ::mmap(nullptr, f.size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(path, std::string("cannot map: ") + std::strerror(err));
    }
  }
  ::close(fd);  // the mapping stays valid
  const size_t size = f.size;
  f.mapping = std::shared_ptr<const void>(map, [size](const void* p) {
    if (p) ::munmap(const_cast<void*>(p), size);
  });
  static const uint8_t kEmpty = 0;
  f.data = map ? static_cast<const uint8_t*>(map) : &kEmpty;
  return f;
}

}  // namespace attn::io
