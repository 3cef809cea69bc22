// posenc: the rotation of a small step (every channel rotated) in one call for q and k, float32
// on CPU. Built on demand by posenc/rotary/cpu_rope.py; tests/test_rotary_cpu_kernel.py.
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

torch::Tensor rotate_one(const torch::Tensor& x, const torch::Tensor& c2, const torch::Tensor& s2) {
  TORCH_CHECK(x.dim() == 4 && c2.dim() == 4 && s2.dim() == 4, "x, c2 and s2 must be 4-D");
  TORCH_CHECK(x.scalar_type() == at::kFloat && c2.scalar_type() == at::kFloat && s2.scalar_type() == at::kFloat,
              "x, c2 and s2 must be float32");
  TORCH_CHECK(x.stride(3) == 1 && c2.stride(3) == 1 && s2.stride(3) == 1, "the last dim must be contiguous");
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3), h = D / 2;
  TORCH_CHECK(D % 2 == 0 && c2.size(3) == D && s2.size(3) == D && c2.size(2) == T && s2.size(2) == T,
              "tables (B|1, 1, T, D) must fit x (B, H, T, D) with D even");
  TORCH_CHECK((c2.size(0) == 1 || c2.size(0) == B) && c2.size(0) == s2.size(0) && c2.size(1) == 1 && s2.size(1) == 1,
              "tables must have batch 1 or B and one head");
  auto out = torch::empty({B, H, T, D}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* cp = c2.data_ptr<float>();
  const float* sp = s2.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t xb = x.stride(0), xh = x.stride(1), xt = x.stride(2);
  const int64_t cb = c2.size(0) == 1 ? 0 : c2.stride(0), ct = c2.stride(2);
  const int64_t sb = s2.size(0) == 1 ? 0 : s2.stride(0), st = s2.stride(2);
  at::parallel_for(0, B * H * T, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (H * T), hh = (r / T) % H, t = r % T;
      const float* xr = xp + b * xb + hh * xh + t * xt;
      const float* c = cp + b * cb + t * ct;
      const float* s = sp + b * sb + t * st;
      float* o = op + r * D;
      for (int64_t i = 0; i < h; ++i) {
        const float p = xr[i] * c[i];
        o[i] = std::fma(xr[i + h], s[i], p);
      }
      for (int64_t i = h; i < D; ++i) {
        const float p = xr[i] * c[i];
        o[i] = std::fma(xr[i - h], s[i], p);
      }
    }
  });
  return out;
}

torch::Tensor rotate_pairs(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4 && cos.dim() == 3 && sin.dim() == 3, "x must be 4-D, cos and sin 3-D");
  TORCH_CHECK(x.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "x, cos and sin must be float32");
  TORCH_CHECK(x.stride(3) == 1 && cos.stride(2) == 1 && sin.stride(2) == 1, "the last dim must be contiguous");
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3), h = D / 2;
  TORCH_CHECK(D % 2 == 0 && cos.size(2) == h && sin.size(2) == h && cos.size(1) == T && sin.size(1) == T,
              "cos and sin (B|1, T, D/2) must fit x (B, H, T, D) with D even");
  TORCH_CHECK((cos.size(0) == 1 || cos.size(0) == B) && cos.size(0) == sin.size(0), "cos and sin must have batch 1 or B");
  auto out = torch::empty({B, H, T, D}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t xb = x.stride(0), xh = x.stride(1), xt = x.stride(2);
  const int64_t cb = cos.size(0) == 1 ? 0 : cos.stride(0), ct = cos.stride(1);
  const int64_t sb = sin.size(0) == 1 ? 0 : sin.stride(0), st = sin.stride(1);
  at::parallel_for(0, B * H * T, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (H * T), hh = (r / T) % H, t = r % T;
      const float* xr = xp + b * xb + hh * xh + t * xt;
      const float* c = cp + b * cb + t * ct;
      const float* s = sp + b * sb + t * st;
      float* o = op + r * D;
      for (int64_t j = 0; j < h; ++j) {
        const float a = xr[2 * j], e = xr[2 * j + 1];
        o[2 * j] = std::fma(-e, s[j], a * c[j]);
        o[2 * j + 1] = std::fma(a, s[j], e * c[j]);
      }
    }
  });
  return out;
}

std::tuple<torch::Tensor, torch::Tensor> rotate_interleaved_qk(const torch::Tensor& q, const torch::Tensor& k,
                                                               const torch::Tensor& cq, const torch::Tensor& sq,
                                                               const torch::Tensor& ck, const torch::Tensor& sk) {
  return {rotate_pairs(q, cq, sq), rotate_pairs(k, ck, sk)};
}

std::tuple<torch::Tensor, torch::Tensor> rotate_half_qk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cq,
                                          const torch::Tensor& sq, const torch::Tensor& ck, const torch::Tensor& sk) {
  return {rotate_one(q, cq, sq), rotate_one(k, ck, sk)};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rotate_half_qk", &rotate_half_qk, "q and k rotated by their rolled tables, half layout (float32, CPU)");
  m.def("rotate_interleaved_qk", &rotate_interleaved_qk, "q and k rotated by cos/sin, interleaved layout (float32, CPU)");
}
