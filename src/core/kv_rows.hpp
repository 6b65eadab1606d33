// Where the rows of K or V live: the one accessor every kernel reads them through.
//
// Today a head's rows are one strided run in a TensorView: row j at base + j * row_stride.
// A paged KV cache (fixed-size blocks addressed through a block table, as vLLM lays memory
// out) will map j to (block_table[j / page], j % page); kernels already ask for rows by runs
// (rows(j0) and run_end(j0)) and clip their key tiles at run ends, so they need no change.
#pragma once
#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::core {

class KvRows {
 public:
  KvRows(const TensorView& t, int64_t b, int64_t h)
      : base_(t.ptr(b, h, 0)), row_bytes_(t.strides[2] * static_cast<int64_t>(dtype_size(t.dtype))),
        rows_(t.tokens()), elem_stride_(t.strides[3]), dim_(t.dim()), dtype_(t.dtype) {}

  // Address of row j (storage type; elements elem_stride() apart).
  const char* row(int64_t j) const { return base_ + j * row_bytes_; }
  // Rows [j0, run_end(j0)) are evenly spaced, row_stride_bytes() apart, starting at row(j0).
  int64_t run_end(int64_t) const { return rows_; }
  int64_t row_stride_bytes() const { return row_bytes_; }
  int64_t elem_stride() const { return elem_stride_; }
  int64_t dim() const { return dim_; }
  DType dtype() const { return dtype_; }
  // Rows are float32 with unit element stride: kernels may read them in place.
  bool plain_f32() const { return dtype_ == DType::f32 && elem_stride_ == 1; }

 private:
  const char* base_;
  int64_t row_bytes_, rows_, elem_stride_, dim_;
  DType dtype_;
};

}  // namespace attn::core
