// Where the rows of K or V live: the one accessor every kernel reads them through.
//
// A head's rows are either one strided run in a TensorView (row j at base + j * row_stride) or,
// for a paged KV cache (AttendOptions::paged, vLLM's layout), blocks of `page` rows addressed
// through the batch entry's row of the block table: row j is row j % page of block
// table[j / page]. Kernels ask for rows by runs (row(j0), run_end(j0): rows up to run_end are
// evenly spaced) and clip their key tiles at run ends, so paging needs nothing of them.
//
// An 8-bit cache's rows (AttendOptions::kv_scales) are int8 with a float32 scale per row, kept in
// a view of the same first three dims and addressed the same way: at() and to_float() give the
// scaled values; kernels reading rows in place take the integers and apply scale(j) themselves.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::core {

// A validated block table (core::check_io): every entry a batch entry's valid keys need is a
// block of the pool.
struct PageTable {
  std::vector<int32_t> table;  // B x per_seq
  int64_t per_seq = 0, page = 0;
};

class KvRows {
 public:
  // Head h of batch entry b of t: plain (pages null) or a page pool (num_blocks, heads, page, dim).
  // scales: the per-row scales of int8 rows, (B or blocks, heads, rows, 1) float32; null for floats.
  KvRows(const TensorView& t, int64_t b, int64_t h, const PageTable* pages = nullptr,
         const TensorView* scales = nullptr)
      : row_bytes_(t.strides[2] * static_cast<int64_t>(dtype_size(t.dtype))), rows_(t.tokens()),
        elem_stride_(t.strides[3]), dim_(t.dim()), dtype_(t.dtype) {
    const int64_t entry = pages ? 0 : b;
    if (pages) {
      blocks_ = pages->table.data() + b * pages->per_seq;
      page_ = pages->page;
      block_bytes_ = t.strides[0] * static_cast<int64_t>(dtype_size(t.dtype));
      rows_ = pages->per_seq * page_;
    }
    base_ = t.ptr(entry, h, 0);
    if (scales) {
      scale_base_ = scales->ptr(entry, h, 0);
      scale_row_bytes_ = scales->strides[2] * static_cast<int64_t>(sizeof(float));
      scale_block_bytes_ = scales->strides[0] * static_cast<int64_t>(sizeof(float));
    }
  }

  // Address of row j (storage type; elements elem_stride() apart).
  const char* row(int64_t j) const { return address(base_, j, row_bytes_, block_bytes_); }
  // int8 rows: row j's values are scale(j) times its integers.
  bool scaled() const { return scale_base_ != nullptr; }
  float scale(int64_t j) const {
    return *reinterpret_cast<const float*>(address(scale_base_, j, scale_row_bytes_, scale_block_bytes_));
  }
  // Rows [j0, run_end(j0)) are evenly spaced, row_stride_bytes() apart, starting at row(j0).
  int64_t run_end(int64_t j0) const { return blocks_ ? std::min(rows_, (j0 / page_ + 1) * page_) : rows_; }
  int64_t row_stride_bytes() const { return row_bytes_; }
  int64_t elem_stride() const { return elem_stride_; }
  int64_t dim() const { return dim_; }
  DType dtype() const { return dtype_; }
  // Rows are float32 with unit element stride: kernels may read them in place.
  bool plain_f32() const { return dtype_ == DType::f32 && elem_stride_ == 1; }
  // Element c of row j as float32 (int8 rows: times the row's scale).
  float at(int64_t j, int64_t c) const {
    const float x = load_as_float(row(j), dtype_, c * elem_stride_);
    return scaled() ? scale(j) * x : x;
  }
  // Row j as dim() float32 values (int8 rows: times the row's scale), converted by `convert`
  // (the kernel table's to_float).
  template <class Convert>
  void to_float(Convert convert, int64_t j, float* dst) const {
    convert(row(j), dtype_, elem_stride_, dim_, dst);
    if (!scaled()) return;
    const float s = scale(j);
    for (int64_t c = 0; c < dim_; ++c) dst[c] *= s;
  }

 private:
  // Row j of a run of rows `stride` bytes apart from `base` (paged: blocks `block` bytes apart).
  const char* address(const char* base, int64_t j, int64_t stride, int64_t block) const {
    if (!blocks_) return base + j * stride;
    return base + blocks_[j / page_] * block + (j % page_) * stride;
  }

  const char* base_ = nullptr;
  const int32_t* blocks_ = nullptr;  // this entry's row of the block table; null: not paged
  int64_t page_ = 0, block_bytes_ = 0;
  const char* scale_base_ = nullptr;  // int8 rows' scales; null: float rows
  int64_t scale_row_bytes_ = 0, scale_block_bytes_ = 0;
  int64_t row_bytes_, rows_, elem_stride_, dim_;
  DType dtype_;
};

}  // namespace attn::core
