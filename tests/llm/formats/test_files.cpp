// Hardening: what attn reads must be a regular file, texts are
// bounded, and outputs replace a file only once the new content is whole, write devices in
// place and never rename over them, and report every write error.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "attn/npy.hpp"
#include "attn/safetensors.hpp"
#include "io/input_file.hpp"
#include "io/output_file.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {
namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::path(::testing::TempDir()) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<std::string> names_in(const fs::path& d) {
  std::vector<std::string> n;
  for (const auto& e : fs::directory_iterator(d)) n.push_back(e.path().filename().string());
  std::sort(n.begin(), n.end());
  return n;
}

TEST(InputFile, RefusesEverythingButARegularFile) {
  const fs::path d = fresh_dir("attn_input_kinds");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  // A FIFO is refused by its stat, before it is opened (opening would wait for a writer).
  testing::expect_error([&] { io::InputFile f((d / "fifo").string()); }, "is a FIFO (named pipe), not a regular file");
  testing::expect_error([&] { io::InputFile f("/dev/zero"); }, "/dev/zero: is a character device, not a regular file");
  testing::expect_error([&] { io::InputFile f(d.string()); }, "is a directory, not a regular file");
  testing::expect_error([&] { io::InputFile f((d / "missing").string()); }, "cannot open: No such file");
  // every reader goes through it: .npy, GGUF and safetensors (mapped), texts
  testing::expect_error([&] { read_npy("/dev/zero"); }, "is a character device");
  testing::expect_error([&] { read_npy((d / "fifo").string()); }, "is a FIFO");
  testing::expect_error([&] { SafetensorsFile::open((d / "fifo").string()); }, "is a FIFO");
  testing::expect_error([&] { io::read_text_file("/dev/urandom"); }, "is a character device");
}

TEST(InputFile, TextsAreBoundedByTheirLimit) {
  const fs::path d = fresh_dir("attn_input_text");
  std::ofstream(d / "t.txt") << std::string(1000, 'a');
  EXPECT_EQ(io::read_text_file((d / "t.txt").string(), 1000).size(), 1000u);
  testing::expect_error([&] { io::read_text_file((d / "t.txt").string(), 999); },
                        "holds 1000 bytes, more than the 0 MiB (999 bytes) a text may have");
  // /proc files claim 0 bytes: the bound holds while reading too
  testing::expect_error([&] { io::read_text_file("/proc/self/maps", 10); }, "is longer than the 0 MiB (10 bytes)");
  EXPECT_EQ(io::kMaxTextBytes, uint64_t{64} << 20);
}

TEST(OutputFile, ReplacesARegularFileOnlyWhenWhole) {
  const fs::path d = fresh_dir("attn_output_replace");
  const std::string p = (d / "o.bin").string();
  std::ofstream(p) << "old";
  fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  {
    io::OutputFile f(p);
    EXPECT_FALSE(f.in_place());
    f.write("new content", 11);
    std::ifstream in(p);
    std::string s;
    in >> s;
    EXPECT_EQ(s, "old");  // not yet
  }  // dropped without commit: the temporary goes, the old file stays
  EXPECT_EQ(names_in(d), std::vector<std::string>{"o.bin"});
  {
    io::OutputFile f(p);
    f.write("new", 3);
    f.commit();
  }
  std::ifstream in(p);
  std::string s;
  in >> s;
  EXPECT_EQ(s, "new");
  EXPECT_EQ(fs::status(p).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);  // the mode it had
  EXPECT_EQ(names_in(d), std::vector<std::string>{"o.bin"});
}

TEST(OutputFile, DevicesAreWrittenInPlaceAndNeverRenamedOver) {
  struct stat before {}, after {};
  ASSERT_EQ(::stat("/dev/null", &before), 0);
  {
    io::OutputFile f("/dev/null");
    EXPECT_TRUE(f.in_place());
    f.write("x", 1);
    f.commit();
  }
  write_npy("/dev/null", DType::f32, {1}, "abcd");
  ASSERT_EQ(::stat("/dev/null", &after), 0);
  EXPECT_TRUE(S_ISCHR(after.st_mode));
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_EQ(before.st_rdev, after.st_rdev);
  // a full device: the write error is reported, not success
  testing::expect_error([] { write_npy("/dev/full", DType::f32, {1}, "abcd"); },
                        "/dev/full: write failed: No space left on device");
  testing::expect_error([] { write_safetensors("/dev/full", {{"t", {DType::f32, {1}, "abcd"}}}, {}); },
                        "/dev/full: write failed: No space left on device");
}

TEST(OutputFile, RefusesDirectoriesAndFifosWithoutAReader) {
  const fs::path d = fresh_dir("attn_output_kinds");
  testing::expect_error([&] { io::OutputFile f(d.string()); }, "is a directory; give a file name");
  testing::expect_error([&] { io::OutputFile::check((d / "no" / "x").string()); }, "cannot create a file beside it");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  io::OutputFile::check((d / "fifo").string());  // checking opens nothing
  testing::expect_error([&] { io::OutputFile f((d / "fifo").string()); },
                        "is a FIFO with no reader; attn does not wait for one");
  EXPECT_EQ(names_in(d), std::vector<std::string>{"fifo"});
  EXPECT_TRUE(fs::is_fifo(d / "fifo"));
}

TEST(OutputFile, ALinkToAFileReplacesTheFileAndKeepsTheLink) {
  const fs::path d = fresh_dir("attn_output_link");
  std::ofstream(d / "real.npy") << "old";
  fs::create_symlink("real.npy", d / "link.npy");
  write_npy((d / "link.npy").string(), DType::f32, {1}, "abcd");
  EXPECT_TRUE(fs::is_symlink(d / "link.npy"));
  EXPECT_EQ(read_npy((d / "real.npy").string()).shape, std::vector<int64_t>{1});
  EXPECT_EQ(names_in(d), (std::vector<std::string>{"link.npy", "real.npy"}));
}

}  // namespace
}  // namespace attn
