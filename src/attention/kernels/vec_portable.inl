// One float "lane": plain C++ that any compiler and CPU runs. Included inside an ISA
// namespace by tile_kernels_isa.cpp. exp, tanh and log come from <cmath> (accurate).
struct Vec {
  static constexpr int W = 1;
  static constexpr int MR = 4;
  static constexpr int NR = 4;
  float v;
  static Vec load(const float* p) { return {*p}; }
  static Vec loadu(const float* p) { return {*p}; }
  void storeu(float* p) const { *p = v; }
  float reduce_add() const { return v; }
  static void reduce4(Vec a, Vec b, Vec c, Vec d, float* out) { out[0] = a.v, out[1] = b.v, out[2] = c.v, out[3] = d.v; }
  static Vec loadu_bf16(const uint16_t* p) { return {bf16_to_float(*p)}; }
  // 2W bfloat16 values at p as floats: those at even indices and those at odd ones. (Used on
  // AVX-512 only; every Vec has it so the shared kernels compile.)
  static void loadu_bf16_pairs(const uint16_t* p, Vec& even, Vec& odd) { even = {bf16_to_float(p[0])}, odd = {bf16_to_float(p[1])}; }
  static Vec loadu_f16(const uint16_t* p) { return {f16_to_float(*p)}; }
  static Vec set1(float x) { return {x}; }
  // A byte (signed) or a nibble (bits Shift..Shift+3 of a byte) as a float: ggml blocks.
  static Vec from_i8(const int8_t* p) { return {static_cast<float>(*p)}; }
  // The float16 at p (unaligned).
  static Vec set1_half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return {f16_to_float(h)};
  }
  template <int Shift>
  static Vec nibbles(const uint8_t* p) { return {static_cast<float>((*p >> Shift) & 15)}; }
  static Vec zero() { return {0.0f}; }
  void store(float* p) const { *p = v; }
  friend Vec operator+(Vec a, Vec b) { return {a.v + b.v}; }
  friend Vec operator-(Vec a, Vec b) { return {a.v - b.v}; }
  friend Vec operator*(Vec a, Vec b) { return {a.v * b.v}; }
  friend Vec operator/(Vec a, Vec b) { return {a.v / b.v}; }
  static Vec fma(Vec a, Vec b, Vec c) { return {a.v * b.v + c.v}; }
  static Vec max(Vec a, Vec b) { return {(b.v != b.v) ? b.v : (a.v > b.v ? a.v : b.v)}; }
  static Vec min(Vec a, Vec b) { return {(b.v != b.v) ? b.v : (a.v < b.v ? a.v : b.v)}; }
  static Vec abs(Vec a) { return {std::fabs(a.v)}; }
  static Vec select_eq(Vec x, Vec y, Vec a, Vec b) { return x.v == y.v ? a : b; }
  static Vec select_lt(Vec x, Vec y, Vec a, Vec b) { return x.v < y.v ? a : b; }
  // gt_bits: bit k set where a[k] > b[k] (false for NaN); nan_bits: bit k set where a[k] is NaN.
  static uint32_t gt_bits(Vec a, Vec b) { return a.v > b.v; }
  static uint32_t nan_bits(Vec a) { return a.v != a.v; }
  float reduce_max() const { return v; }
  static void transpose(Vec*) {}  // 1 x 1
};

#define ATTN_PORTABLE_MATH 1
inline Vec vexp(Vec x) { return {std::exp(x.v)}; }
inline Vec vtanh(Vec x) { return {std::tanh(x.v)}; }
inline Vec vlog(Vec x) { return {std::log(x.v)}; }

inline void to_float_unit(const void* src, DType dtype, int64_t n, float* dst) {
  for (int64_t c = 0; c < n; ++c) dst[c] = load_as_float(src, dtype, c);
}

inline void from_float_unit(const float* src, DType dtype, int64_t n, void* dst) {
  for (int64_t c = 0; c < n; ++c) store_from_float(dst, dtype, c, src[c]);
}
