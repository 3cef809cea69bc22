// posenc: PoPE's polar turn, forward and backward, one pass each, float32 on CPU. Compiled into
// the fused CPU rotary kernel beside rope_cpu.cpp (posenc/rotary/cpu_rope.py, which builds it for
// this CPU's vector width); tests/test_pope_cpu_kernel.py.
//
// Forward, x (B, H, T, D) and the phases' cos and sin c, s (B|1, H|1, T, D):
//   mu = softplus(x) = x > 20 ? x : log1p(exp(x)),   out = [mu c | mu s]   (B, H, T, 2D)
// with ATen's vectorised exp and log1p, as ATen's own softplus computes it (same bits on the
// CPU torch dispatches for).
// Backward from the output alone (posenc.rotary.pope._PolarTurn): mu = |(o_c, o_s)|,
//   dx = (g_c o_c + g_s o_s) (1 - e^-mu) / mu   (1 where mu = 0),   dc = g_c mu,   ds = g_s mu,
// and a phase bias's gradient, sum over b and t of g_c o_s - g_s o_c.
// Eager PyTorch takes about a dozen passes over the tensors for these; here each is one, and the
// backward's magnitude and slope take cheaper forms than ATen's hypot and expm1 (magnitude(),
// softplus_slope()): 0.8 against 2.8 ms for q of (2, 8, 1024, 64), 2 threads.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <tuple>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kGrain = 64;  // rows per task of at::parallel_for

// Rows of a (B|1, H|1, T, W) tensor, a size-1 batch or head dim read with stride 0.
struct Rows {
  const float* p;
  int64_t b, h, t;
  explicit Rows(const torch::Tensor& x)
      : p(x.data_ptr<float>()), b(x.size(0) == 1 ? 0 : x.stride(0)), h(x.size(1) == 1 ? 0 : x.stride(1)), t(x.stride(2)) {}
  const float* at(int64_t bi, int64_t hi, int64_t ti) const { return p + bi * b + hi * h + ti * t; }
};

void check_float_rows(const torch::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 4 && x.scalar_type() == at::kFloat && x.device().is_cpu(), name,
              " must be a 4-D float32 CPU tensor");
  TORCH_CHECK(x.stride(3) == 1, name, "'s last dim must be contiguous");
}

// Every row r of (B, H, T), split over threads: row(r, b, h, t).
template <typename Row>
void each_row(int64_t B, int64_t H, int64_t T, Row row) {
  at::parallel_for(0, B * H * T, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) row(r, r / (H * T), (r / T) % H, r % T);
  });
}

torch::Tensor polar_turn(const torch::Tensor& x, const torch::Tensor& c, const torch::Tensor& s) {
  check_float_rows(x, "x");
  check_float_rows(c, "cos");
  check_float_rows(s, "sin");
  TORCH_CHECK(c.sizes() == s.sizes(), "cos and sin must have one shape");
  for (int64_t d = 0; d < 4; ++d)
    TORCH_CHECK(c.size(d) == x.size(d) || (d < 2 && c.size(d) == 1), "cos and sin (B|1, H|1, T, D) must fit x (B, H, T, D)");
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  auto out = torch::empty({B, H, T, 2 * D}, x.options());
  const Rows xr(x), cr(c), sr(s);
  float* op = out.data_ptr<float>();
  const Vec threshold(20.f);
  each_row(B, H, T, [&](int64_t r, int64_t b, int64_t h, int64_t t) {
    const float *xp = xr.at(b, h, t), *cp = cr.at(b, h, t), *sp = sr.at(b, h, t);
    float* o = op + r * 2 * D;
    for (int64_t j = 0; j < D; j += Vec::size()) {
      const int64_t n = std::min<int64_t>(Vec::size(), D - j);
      const Vec v = Vec::loadu(xp + j, n);
      const Vec mu = Vec::blendv(v.exp().log1p(), v, v > threshold);
      (mu * Vec::loadu(cp + j, n)).store(o + j, n);
      (mu * Vec::loadu(sp + j, n)).store(o + D + j, n);
    }
  });
  return out;
}

// |(a, b)| = m sqrt(1 + (n / m)^2), m = max(|a|, |b|), n = min(|a|, |b|): no overflow or underflow
// in the squares, within two roundings of hypot (ATen's vectorised hypot is four times the cost
// of this whole backward's other arithmetic). NaN in, NaN out; 0 where both are 0.
inline Vec magnitude(const Vec& a, const Vec& b) {
  const Vec x = a.abs(), y = b.abs();
  const Vec m = at::vec::maximum(x, y), r = at::vec::minimum(x, y) / m;
  return Vec::blendv(m * (Vec(1.f) + r * r).sqrt(), Vec(0.f), m == Vec(0.f));
}

// softplus'(x) / softplus(x) = (1 - e^-mu) / mu at mu = softplus(x) >= 0. Below 1/4 its series
// sum_n (-mu)^n / (n + 1)! to mu^5 (the rest under mu^6 / 5040 = 5e-8); from 1/4 on 1 - e^-mu
// is exact from the rounded exp (e^-mu > 1/2 there or small against 1), within 3e-7. -> 1 as
// mu -> 0 (mu == 0: softplus underflowed), 0 at mu = inf.
inline Vec softplus_slope(const Vec& mu) {
  const Vec one(1.f);
  const Vec series = one - mu * (Vec(1.f / 2) - mu * (Vec(1.f / 6) - mu * (Vec(1.f / 24) - mu * (Vec(1.f / 120) - mu * Vec(1.f / 720)))));
  return Vec::blendv((one - (Vec(0.f) - mu).exp()) / mu, series, mu < Vec(0.25f));
}

// (dx, dc, ds, dbias) from the forward's output and its gradient, (B, H, T, 2D) each. dc and ds
// (B, H, T, D) with `tables`; dbias (H, D) with `bias`: the gradient of a phase bias taken off
// the phases (c = cos(a - delta), s = sin(a - delta)), whose derivative in delta is (o_s, -o_c):
//   dbias = sum over b and t of (g_c o_s - g_s o_c).
// Undefined tensors for what is not asked. The sum is taken per head and block of kBiasRows
// positions, then over the blocks in order: the same bits for any number of threads.
constexpr int64_t kBiasRows = 256;

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> polar_turn_backward(
    const torch::Tensor& out, const torch::Tensor& grad, bool tables, bool bias) {
  check_float_rows(out, "out");
  check_float_rows(grad, "grad");
  TORCH_CHECK(out.is_contiguous() && out.size(3) % 2 == 0, "out must be contiguous, of even width 2D");
  TORCH_CHECK(grad.sizes() == out.sizes(), "grad must have out's shape");
  const int64_t B = out.size(0), H = out.size(1), T = out.size(2), D = out.size(3) / 2;
  auto dx = torch::empty({B, H, T, D}, out.options());
  torch::Tensor dc, ds, dbias, partial;
  if (tables) {
    dc = torch::empty_like(dx);
    ds = torch::empty_like(dx);
  }
  const int64_t blocks = (T + kBiasRows - 1) / kBiasRows;
  if (bias) partial = torch::zeros({H, blocks, D}, out.options());
  const Rows gr(grad);
  const float* op = out.data_ptr<float>();
  float* dxp = dx.data_ptr<float>();
  float* dcp = tables ? dc.data_ptr<float>() : nullptr;
  float* dsp = tables ? ds.data_ptr<float>() : nullptr;
  float* pp = bias ? partial.data_ptr<float>() : nullptr;
  // A task: one head, one block of positions, every batch row; tasks of kGrain rows or more.
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, B * std::min(T, kBiasRows)));
  at::parallel_for(0, H * blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task / blocks, t0 = (task % blocks) * kBiasRows, t1 = std::min(T, t0 + kBiasRows);
      float* acc = bias ? pp + task * D : nullptr;
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t r = (b * H + h) * T + t;
          const float *o = op + r * 2 * D, *g = gr.at(b, h, t);
          for (int64_t j = 0; j < D; j += Vec::size()) {
            const int64_t n = std::min<int64_t>(Vec::size(), D - j), i = r * D + j;
            const Vec oc = Vec::loadu(o + j, n), os = Vec::loadu(o + D + j, n);
            const Vec gc = Vec::loadu(g + j, n), gs = Vec::loadu(g + D + j, n);
            const Vec mu = magnitude(oc, os);
            const Vec slope = softplus_slope(mu);
            ((gc * oc + gs * os) * slope).store(dxp + i, n);
            if (tables) {
              (gc * mu).store(dcp + i, n);
              (gs * mu).store(dsp + i, n);
            }
            if (bias) (Vec::loadu(acc + j, n) + (gc * os - gs * oc)).store(acc + j, n);
          }
        }
      }
    }
  });
  if (bias) {  // over the blocks, in order
    dbias = torch::zeros({H, D}, out.options());
    float* db = dbias.data_ptr<float>();
    for (int64_t h = 0; h < H; ++h)
      for (int64_t k = 0; k < blocks; ++k)
        for (int64_t j = 0; j < D; ++j) db[h * D + j] += pp[(h * blocks + k) * D + j];
  }
  return {dx, dc, ds, dbias};
}

}  // namespace

// Called from rope_cpu.cpp's module definition: one library holds both.
void define_pope(pybind11::module_& m) {
  m.def("polar_turn", &polar_turn, "[softplus(x) cos | softplus(x) sin], (B, H, T, D) -> (B, H, T, 2D) (float32, CPU)");
  m.def("polar_turn_backward", &polar_turn_backward,
        "dx; dcos and dsin (tables=True); a phase bias's gradient (bias=True): from the output and its gradient");
}
