// 16 float lanes on AVX-512F. Included inside an ISA namespace by tile_kernels_isa.cpp.
struct Vec {
  static constexpr int W = 16;
  static constexpr int MR = 4;  // query vectors per micro-tile: 64 lanes = the whole query tile
  static constexpr int NR = 6;  // keys (QK) or value channels (PV) per micro-tile: 24 accumulators
  __m512 v;
  static Vec load(const float* p) { return {_mm512_load_ps(p)}; }
  static Vec loadu(const float* p) { return {_mm512_loadu_ps(p)}; }
  void storeu(float* p) const { _mm512_storeu_ps(p, v); }
  float reduce_add() const { return _mm512_reduce_add_ps(v); }
  // The four sums of a, b, c, d at once (shuffles shared): out[0..3].
  static void reduce4(Vec a, Vec b, Vec c, Vec d, float* out) {
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a.v, b.v), _mm512_unpackhi_ps(a.v, b.v));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c.v, d.v), _mm512_unpackhi_ps(c.v, d.v));
    const __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
    const __m512 q = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(abd, cdd)), _mm512_castpd_ps(_mm512_unpackhi_pd(abd, cdd)));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(q), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(q), 1)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  }
  // The 16 sums of a 4x4 block, a[x][r] summed into s[r * lds + x]: one shuffle tree for all
  // sixteen (45 operations; four reduce4 take 52 and 16 scalar stores).
  static void sums4x4(const Vec (&a)[4][4], float* s, int64_t lds) {
    __m512 b[8];  // b[i]: the pair a[.][2i/4], a[.][(2i+1)/4] folded to 8 lanes each
    for (int i = 0; i < 8; ++i) {
      const __m512 u = a[(2 * i) % 4][(2 * i) / 4].v, w = a[(2 * i + 1) % 4][(2 * i + 1) / 4].v;
      b[i] = _mm512_add_ps(_mm512_unpacklo_ps(u, w), _mm512_unpackhi_ps(u, w));
    }
    __m512 c[4];  // c[i]: sums i*4 .. i*4+3 as one lane per 128-bit block
    for (int i = 0; i < 4; ++i)
      c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44), _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xee));
    const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x44), _mm512_shuffle_f32x4(c[0], c[1], 0xee));
    const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x44), _mm512_shuffle_f32x4(c[2], c[3], 0xee));
    const __m512 e = _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xdd));
    _mm_storeu_ps(s, _mm512_castps512_ps128(e));
    _mm_storeu_ps(s + lds, _mm512_extractf32x4_ps(e, 1));
    _mm_storeu_ps(s + 2 * lds, _mm512_extractf32x4_ps(e, 2));
    _mm_storeu_ps(s + 3 * lds, _mm512_extractf32x4_ps(e, 3));
  }
  static Vec loadu_bf16(const uint16_t* p) {
    return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16))};
  }
  // 2W bfloat16 values at p as floats: those at even indices (0, 2, ...) and those at odd ones,
  // by a shift and a mask of one load (half the work of two widening loads).
  static void loadu_bf16_pairs(const uint16_t* p, Vec& even, Vec& odd) {
    const __m512i v = _mm512_loadu_si512(p);
    even = {_mm512_castsi512_ps(_mm512_slli_epi32(v, 16))};
    odd = {_mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
  }
  static Vec loadu_f16(const uint16_t* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
  static Vec set1(float x) { return {_mm512_set1_ps(x)}; }
  // W bytes (signed) or W nibbles (bits Shift..Shift+3 of W bytes) as floats: ggml blocks.
  static Vec from_i8(const int8_t* p) {
    return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
  }
  // The float16 at p (unaligned) in every lane: a broadcast load and one conversion.
  static Vec set1_half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return {_mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(h)))};
  }
  template <int Shift>
  static Vec nibbles(const uint8_t* p) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    // a zero-extended byte shifted right by 4 is its high nibble already
    if constexpr (Shift == 4) return {_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4))};
    else return {_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(b, Shift), _mm512_set1_epi32(15)))};
  }
  static Vec zero() { return {_mm512_setzero_ps()}; }
  void store(float* p) const { _mm512_store_ps(p, v); }
  friend Vec operator+(Vec a, Vec b) { return {_mm512_add_ps(a.v, b.v)}; }
  friend Vec operator-(Vec a, Vec b) { return {_mm512_sub_ps(a.v, b.v)}; }
  friend Vec operator*(Vec a, Vec b) { return {_mm512_mul_ps(a.v, b.v)}; }
  friend Vec operator/(Vec a, Vec b) { return {_mm512_div_ps(a.v, b.v)}; }
  static Vec fma(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
  // NaN in b propagates (the second operand wins when one is NaN).
  static Vec max(Vec a, Vec b) { return {_mm512_max_ps(a.v, b.v)}; }
  static Vec min(Vec a, Vec b) { return {_mm512_min_ps(a.v, b.v)}; }
  static Vec abs(Vec a) { return {_mm512_abs_ps(a.v)}; }
  static Vec copysign(Vec mag, Vec sign) {
    const __m512i m = _mm512_set1_epi32(0x80000000);
    return {_mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(sign.v),
                                                          _mm512_castps_si512(mag.v), m, 0xe4))};
  }
  // where(cond) ? a : b, cond = (x == y)
  static Vec select_eq(Vec x, Vec y, Vec a, Vec b) {
    return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(x.v, y.v, _CMP_EQ_OQ), b.v, a.v)};
  }
  static Vec select_lt(Vec x, Vec y, Vec a, Vec b) {
    return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(x.v, y.v, _CMP_LT_OQ), b.v, a.v)};
  }
  // gt_bits: bit k set where a[k] > b[k] (false when either is NaN); nan_bits: where a[k] is NaN.
  static uint32_t gt_bits(Vec a, Vec b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ); }
  static uint32_t nan_bits(Vec a) { return _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q); }
  float reduce_max() const { return _mm512_reduce_max_ps(v); }
  // x = mantissa(x) * 2^exponent(x) with mantissa in [1, 2), for positive finite x (getexp and
  // getmant handle denormals too; 0 gives exponent -inf).
  static Vec exponent(Vec x) { return {_mm512_getexp_ps(x.v)}; }
  static Vec mantissa(Vec x) { return {_mm512_getmant_ps(x.v, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero)}; }
  static Vec round(Vec a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
  // p * 2^n for integral n (n clamped by the caller); exact, handles underflow to 0.
  static Vec ldexp(Vec p, Vec n) { return {_mm512_scalef_ps(p.v, n.v)}; }
  // r[k] lane c <-> r[c] lane k (16 x 16): pairs of rows, pairs of pairs, then 128-bit quarters.
  static void transpose(Vec* r) {
    __m512 t[16];
    for (int k = 0; k < 16; k += 2) {
      t[k] = _mm512_unpacklo_ps(r[k].v, r[k + 1].v);
      t[k + 1] = _mm512_unpackhi_ps(r[k].v, r[k + 1].v);
    }
    __m512 u[16];
    for (int k = 0; k < 16; k += 4)
      for (int h = 0; h < 2; ++h) {
        const __m512d a = _mm512_castps_pd(t[k + h]), b = _mm512_castps_pd(t[k + h + 2]);
        u[k + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[k + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
      }
    for (int k = 0; k < 16; k += 8)
      for (int h = 0; h < 4; ++h) {
        t[k + h] = _mm512_shuffle_f32x4(u[k + h], u[k + h + 4], 0x88);
        t[k + h + 4] = _mm512_shuffle_f32x4(u[k + h], u[k + h + 4], 0xdd);
      }
    for (int h = 0; h < 8; ++h) {
      r[h].v = _mm512_shuffle_f32x4(t[h], t[h + 8], 0x88);
      r[h + 8].v = _mm512_shuffle_f32x4(t[h], t[h + 8], 0xdd);
    }
  }
};

inline void to_float_unit(const void* src, DType dtype, int64_t n, float* dst) {
  int64_t c = 0;
  if (dtype == DType::f16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (; c + 16 <= n; c += 16)
      _mm512_storeu_ps(dst + c, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + c))));
  } else if (dtype == DType::bf16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (; c + 16 <= n; c += 16) {
      const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + c)));
      _mm512_storeu_ps(dst + c, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
  } else if (dtype == DType::i8) {
    const int8_t* s = static_cast<const int8_t*>(src);
    for (; c + 16 <= n; c += 16) Vec::from_i8(s + c).storeu(dst + c);
  }
  for (; c < n; ++c) dst[c] = load_as_float(src, dtype, c);
}

inline void from_float_unit(const float* src, DType dtype, int64_t n, void* dst) {
  int64_t c = 0;
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (dtype == DType::f16) {
    for (; c + 16 <= n; c += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + c),
                          _mm512_cvtps_ph(_mm512_loadu_ps(src + c), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else if (dtype == DType::bf16) {
    for (; c + 16 <= n; c += 16) {  // round to nearest even; NaN stays a (quiet) NaN
      const __m512 x = _mm512_loadu_ps(src + c);
      const __m512i u = _mm512_castps_si512(x);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
      const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + c), _mm512_cvtepi32_epi16(r));
    }
  }
  for (; c < n; ++c) store_from_float(dst, dtype, c, src[c]);
}
