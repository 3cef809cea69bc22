// posenc: the rotation of a small step (every channel rotated) in one call for q and k, float32
// on CPU; per-head tables too (rope_mixed). Built on demand by posenc/rotary/cpu_rope.py; tests/test_rotary_cpu_kernel.py.
//
// Half layout, x (B, H, T, D) and the rolled tables c2 = [cos | cos], s2 = [-sin | sin], (B|1, 1, T, D):
//   out[i] = x[i] * c2[i] + x[(i - D/2) mod D] * s2[i]
// which is posenc.rotary.kernels.rotate_half_rolled (x * c2, then addcmul_ of roll(x, D/2) * s2)
// with the same two roundings per element: one product rounded, then a fused multiply-add of the
// second, as ATen's addcmul_ does on an FMA CPU.
// Interleaved layout, pairs (x[2j], x[2j+1]) and cos, sin (B|1, T, D/2):
//   out[2j] = x[2j] cos_j - x[2j+1] sin_j,  out[2j+1] = x[2j+1] cos_j + x[2j] sin_j
// (the eager kernel's complex product, within a rounding of it).
#include <torch/extension.h>

#include <cmath>
#include <tuple>

namespace {

// The checks both layouts share: x (B, H, T, D) float32 with D even; cos-like and sin-like
// tables float32 with their positions at dim `tdim`, `width` values each, batch 1 or B.
void check(const torch::Tensor& x, const torch::Tensor& c, const torch::Tensor& s, int64_t dims, int64_t width,
           const char* shape) {
  TORCH_CHECK(x.dim() == 4 && c.dim() == dims && s.dim() == dims, "x must be 4-D and the tables ", shape);
  TORCH_CHECK(x.scalar_type() == at::kFloat && c.scalar_type() == at::kFloat && s.scalar_type() == at::kFloat,
              "x and the tables must be float32");
  TORCH_CHECK(x.stride(3) == 1 && c.stride(dims - 1) == 1 && s.stride(dims - 1) == 1, "the last dim must be contiguous");
  const int64_t B = x.size(0), T = x.size(2), D = x.size(3);
  TORCH_CHECK(D % 2 == 0 && c.sizes() == s.sizes() && c.size(dims - 1) == width && c.size(dims - 2) == T &&
                  (c.size(0) == 1 || c.size(0) == B) && (dims == 3 || c.size(1) == 1),
              "tables ", shape, " must fit x (B, H, T, D) with D even");
}

// Rows of a table: (B|1, ..., T, W), the batch at dim 0 (stride 0 when it is 1), positions at `tdim`.
struct Rows {
  const float* p;
  int64_t b, t;
  Rows(const torch::Tensor& x, int64_t tdim) : p(x.data_ptr<float>()), b(x.size(0) == 1 ? 0 : x.stride(0)), t(x.stride(tdim)) {}
  const float* at(int64_t bi, int64_t ti) const { return p + bi * b + ti * t; }
};

// out (B, H, T, D), contiguous: row(x's row, its position's cos-like and sin-like rows, out's row, D).
template <typename Row>
torch::Tensor each_row(const torch::Tensor& x, const Rows& c, const Rows& s, Row row) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  auto out = torch::empty({B, H, T, D}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t xb = x.stride(0), xh = x.stride(1), xt = x.stride(2);
  at::parallel_for(0, B * H * T, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (H * T), hh = (r / T) % H, t = r % T;
      row(xp + b * xb + hh * xh + t * xt, c.at(b, t), s.at(b, t), op + r * D, D);
    }
  });
  return out;
}

torch::Tensor rotate_half(const torch::Tensor& x, const torch::Tensor& c2, const torch::Tensor& s2) {
  check(x, c2, s2, 4, x.size(3), "(B|1, 1, T, D)");
  return each_row(x, Rows(c2, 2), Rows(s2, 2), [](const float* x, const float* c, const float* s, float* o, int64_t D) {
    const int64_t h = D / 2;
    for (int64_t i = 0; i < h; ++i) o[i] = std::fma(x[i + h], s[i], x[i] * c[i]);
    for (int64_t i = h; i < D; ++i) o[i] = std::fma(x[i - h], s[i], x[i] * c[i]);
  });
}

torch::Tensor rotate_pairs(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  check(x, cos, sin, 3, x.size(3) / 2, "(B|1, T, D/2)");
  return each_row(x, Rows(cos, 1), Rows(sin, 1), [](const float* x, const float* c, const float* s, float* o, int64_t D) {
    for (int64_t j = 0; j < D / 2; ++j) {
      const float a = x[2 * j], e = x[2 * j + 1];
      o[2 * j] = std::fma(-e, s[j], a * c[j]);
      o[2 * j + 1] = std::fma(a, s[j], e * c[j]);
    }
  });
}

std::tuple<torch::Tensor, torch::Tensor> rotate_half_qk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cq,
                                                        const torch::Tensor& sq, const torch::Tensor& ck, const torch::Tensor& sk) {
  return {rotate_half(q, cq, sq), rotate_half(k, ck, sk)};
}

std::tuple<torch::Tensor, torch::Tensor> rotate_interleaved_qk(const torch::Tensor& q, const torch::Tensor& k,
                                                               const torch::Tensor& cq, const torch::Tensor& sq,
                                                               const torch::Tensor& ck, const torch::Tensor& sk) {
  return {rotate_pairs(q, cq, sq), rotate_pairs(k, ck, sk)};
}

// Per-head tables (rope_mixed's learned frequencies), cos and sin (B|1, H|1, T, D/2) of x's
// (B, H, T, D) pairs: the half layout's (x[j], x[j + D/2]) or the interleaved (x[2j], x[2j+1]),
//   out_a = a cos_j - b sin_j,  out_b = b cos_j + a sin_j
// (posenc.rotary.axial._rotate_heads, within a rounding of it: one product rounded, then a
// fused multiply-add).
torch::Tensor rotate_heads(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, bool interleaved) {
  TORCH_CHECK(x.dim() == 4 && cos.dim() == 4 && sin.dim() == 4, "x and the tables must be 4-D");
  TORCH_CHECK(x.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "x and the tables must be float32");
  TORCH_CHECK(x.stride(3) == 1 && cos.stride(3) == 1 && sin.stride(3) == 1, "the last dim must be contiguous");
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3), h = D / 2;
  TORCH_CHECK(D % 2 == 0 && cos.sizes() == sin.sizes() && cos.size(3) == h && cos.size(2) == T &&
                  (cos.size(0) == 1 || cos.size(0) == B) && (cos.size(1) == 1 || cos.size(1) == H),
              "tables (B|1, H|1, T, D/2) must fit x (B, H, T, D) with D even");
  auto out = torch::empty({B, H, T, D}, x.options());
  const float *xp = x.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t cb = cos.size(0) == 1 ? 0 : cos.stride(0), ch = cos.size(1) == 1 ? 0 : cos.stride(1), ct = cos.stride(2);
  const int64_t sb = sin.size(0) == 1 ? 0 : sin.stride(0), sh = sin.size(1) == 1 ? 0 : sin.stride(1), st = sin.stride(2);
  at::parallel_for(0, B * H * T, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (H * T), hh = (r / T) % H, t = r % T;
      const float* xr = xp + b * x.stride(0) + hh * x.stride(1) + t * x.stride(2);
      const float *c = cp + b * cb + hh * ch + t * ct, *s = sp + b * sb + hh * sh + t * st;
      float* o = op + r * D;
      for (int64_t j = 0; j < h; ++j) {
        const int64_t ia = interleaved ? 2 * j : j, ib = interleaved ? 2 * j + 1 : j + h;
        const float a = xr[ia], e = xr[ib];
        o[ia] = std::fma(-e, s[j], a * c[j]);
        o[ib] = std::fma(a, s[j], e * c[j]);
      }
    }
  });
  return out;
}

std::tuple<torch::Tensor, torch::Tensor> rotate_heads_qk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cq,
                                                         const torch::Tensor& sq, const torch::Tensor& ck, const torch::Tensor& sk,
                                                         bool interleaved) {
  return {rotate_heads(q, cq, sq, interleaved), rotate_heads(k, ck, sk, interleaved)};
}

}  // namespace

void define_pope(pybind11::module_& m);     // pope_cpu.cpp
void define_floater(pybind11::module_& m);  // floater_cpu.cpp
void define_gru(pybind11::module_& m);      // gru_cpu.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rotate_half_qk", &rotate_half_qk, "q and k rotated by their rolled tables, half layout (float32, CPU)");
  m.def("rotate_interleaved_qk", &rotate_interleaved_qk, "q and k rotated by cos/sin, interleaved layout (float32, CPU)");
  m.def("rotate_heads_qk", &rotate_heads_qk,
        "q and k rotated by per-head cos/sin (B|1, H|1, T, D/2), either layout (float32, CPU)");
  define_pope(m);
  define_floater(m);
  define_gru(m);
}
