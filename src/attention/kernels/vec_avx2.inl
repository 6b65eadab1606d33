// 8 float lanes on AVX2+FMA. Included inside an ISA namespace by tile_kernels_isa.cpp.
struct Vec {
  static constexpr int W = 8;
  static constexpr int MR = 2;  // 16 query lanes per micro-tile (16 ymm registers in all)
  static constexpr int NR = 6;  // 12 accumulators + 2 query loads + 1 broadcast
  __m256 v;
  static Vec load(const float* p) { return {_mm256_load_ps(p)}; }
  static Vec loadu(const float* p) { return {_mm256_loadu_ps(p)}; }
  void storeu(float* p) const { _mm256_storeu_ps(p, v); }
  static Vec loadu_bf16(const uint16_t* p) {
    return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16))};
  }
  // 2W bfloat16 values at p as floats: those at even indices and those at odd ones. (The decode
  // kernels pair bf16 loads on AVX-512 only; every Vec has it so the shared kernels compile.)
  static void loadu_bf16_pairs(const uint16_t* p, Vec& even, Vec& odd) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = {_mm256_castsi256_ps(_mm256_slli_epi32(v, 16))};
    odd = {_mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))))};
  }
  static Vec loadu_f16(const uint16_t* p) { return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))}; }
  float reduce_add() const {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
  // The four sums of a, b, c, d at once (shuffles shared): out[0..3].
  static void reduce4(Vec a, Vec b, Vec c, Vec d, float* out) {
    const __m256 q = _mm256_hadd_ps(_mm256_hadd_ps(a.v, b.v), _mm256_hadd_ps(c.v, d.v));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1)));
  }
  static Vec set1(float x) { return {_mm256_set1_ps(x)}; }
  // W bytes (signed) or W nibbles (bits Shift..Shift+3 of W bytes) as floats: ggml blocks.
  static Vec from_i8(const int8_t* p) {
    return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))))};
  }
  // The float16 at p (unaligned) in every lane: a broadcast load and one conversion.
  static Vec set1_half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return {_mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h)))};
  }
  template <int Shift>
  static Vec nibbles(const uint8_t* p) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    // a zero-extended byte shifted right by 4 is its high nibble already
    if constexpr (Shift == 4) return {_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4))};
    else return {_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(b, Shift), _mm256_set1_epi32(15)))};
  }
  static Vec zero() { return {_mm256_setzero_ps()}; }
  void store(float* p) const { _mm256_store_ps(p, v); }
  friend Vec operator+(Vec a, Vec b) { return {_mm256_add_ps(a.v, b.v)}; }
  friend Vec operator-(Vec a, Vec b) { return {_mm256_sub_ps(a.v, b.v)}; }
  friend Vec operator*(Vec a, Vec b) { return {_mm256_mul_ps(a.v, b.v)}; }
  friend Vec operator/(Vec a, Vec b) { return {_mm256_div_ps(a.v, b.v)}; }
  static Vec fma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
  static Vec max(Vec a, Vec b) { return {_mm256_max_ps(a.v, b.v)}; }
  static Vec min(Vec a, Vec b) { return {_mm256_min_ps(a.v, b.v)}; }
  static Vec abs(Vec a) { return {_mm256_andnot_ps(_mm256_set1_ps(-0.0f), a.v)}; }
  static Vec copysign(Vec mag, Vec sign) {
    const __m256 s = _mm256_set1_ps(-0.0f);
    return {_mm256_or_ps(_mm256_andnot_ps(s, mag.v), _mm256_and_ps(s, sign.v))};
  }
  static Vec select_eq(Vec x, Vec y, Vec a, Vec b) {
    return {_mm256_blendv_ps(b.v, a.v, _mm256_cmp_ps(x.v, y.v, _CMP_EQ_OQ))};
  }
  static Vec select_lt(Vec x, Vec y, Vec a, Vec b) {
    return {_mm256_blendv_ps(b.v, a.v, _mm256_cmp_ps(x.v, y.v, _CMP_LT_OQ))};
  }
  // gt_bits: bit k set where a[k] > b[k] (false when either is NaN); nan_bits: where a[k] is NaN.
  static uint32_t gt_bits(Vec a, Vec b) { return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a.v, b.v, _CMP_GT_OQ))); }
  static uint32_t nan_bits(Vec a) { return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q))); }
  float reduce_max() const {
    const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
  }
  // x = mantissa(x) * 2^exponent(x) with mantissa in [1, 2), for positive normal x only (read
  // from the bit pattern: denormals, 0, inf and NaN give meaningless values).
  static Vec exponent(Vec x) {
    const __m256i e = _mm256_srli_epi32(_mm256_castps_si256(x.v), 23);
    return {_mm256_cvtepi32_ps(_mm256_sub_epi32(e, _mm256_set1_epi32(127)))};
  }
  static Vec mantissa(Vec x) {
    const __m256i m = _mm256_and_si256(_mm256_castps_si256(x.v), _mm256_set1_epi32(0x007fffff));
    return {_mm256_castsi256_ps(_mm256_or_si256(m, _mm256_set1_epi32(0x3f800000)))};
  }
  static Vec round(Vec a) { return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
  // p * 2^n for integral n in [-127, 128]: 2^-127 builds as +0, 2^128 as +inf.
  static Vec ldexp(Vec p, Vec n) {
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.v), _mm256_set1_epi32(127)), 23);
    return {_mm256_mul_ps(p.v, _mm256_castsi256_ps(e))};
  }
  // r[k] lane c <-> r[c] lane k (8 x 8).
  static void transpose(Vec* r) {
    __m256 t[8], u[8];
    for (int k = 0; k < 8; k += 2) {
      t[k] = _mm256_unpacklo_ps(r[k].v, r[k + 1].v);
      t[k + 1] = _mm256_unpackhi_ps(r[k].v, r[k + 1].v);
    }
    for (int k = 0; k < 8; k += 4)
      for (int h = 0; h < 2; ++h) {
        u[k + 2 * h] = _mm256_shuffle_ps(t[k + h], t[k + h + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[k + 2 * h + 1] = _mm256_shuffle_ps(t[k + h], t[k + h + 2], _MM_SHUFFLE(3, 2, 3, 2));
      }
    for (int h = 0; h < 4; ++h) {
      r[h].v = _mm256_permute2f128_ps(u[h], u[h + 4], 0x20);
      r[h + 4].v = _mm256_permute2f128_ps(u[h], u[h + 4], 0x31);
    }
  }
};

inline void to_float_unit(const void* src, DType dtype, int64_t n, float* dst) {
  int64_t c = 0;
  if (dtype == DType::f16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (; c + 8 <= n; c += 8)
      _mm256_storeu_ps(dst + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + c))));
  } else if (dtype == DType::bf16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (; c + 8 <= n; c += 8) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + c)));
      _mm256_storeu_ps(dst + c, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
  } else if (dtype == DType::i8) {
    const int8_t* s = static_cast<const int8_t*>(src);
    for (; c + 8 <= n; c += 8) Vec::from_i8(s + c).storeu(dst + c);
  }
  for (; c < n; ++c) dst[c] = load_as_float(src, dtype, c);
}

inline void from_float_unit(const float* src, DType dtype, int64_t n, void* dst) {
  int64_t c = 0;
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (dtype == DType::f16) {
    for (; c + 8 <= n; c += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + c),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + c), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; c < n; ++c) store_from_float(dst, dtype, c, src[c]);  // bf16: scalar
}
