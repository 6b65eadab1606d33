#include <gtest/gtest.h>

#include "attn/error.hpp"
#include "attn/isa.hpp"

namespace attn {
namespace {

TEST(CpuFeatures, SupportedListStartsPortableAndEndsWithBest) {
  const auto isas = supported_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::portable);
  EXPECT_EQ(isas.back(), best_supported_isa());
  EXPECT_LE(active_isa(), best_supported_isa());
}

TEST(CpuFeatures, SetIsaRefusesWhatTheCpuCannotRun) {
  const Isa before = active_isa();
  set_isa(Isa::portable);
  EXPECT_EQ(active_isa(), Isa::portable);
  if (best_supported_isa() < Isa::avx512) {
    EXPECT_THROW(set_isa(Isa::avx512), Error);
  }
  set_isa(before);
}

}  // namespace
}  // namespace attn
