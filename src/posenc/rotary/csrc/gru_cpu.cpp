// posenc: the GRU recurrence of the recurrent encoding (posenc/absolute/recurrent.py), forward and
// backward, on CPU, float32 or float64, one batch row per task. Compiled into the fused CPU kernel
// library (posenc/rotary/cpu_rope.py); tests/test_recurrent_cpu_kernel.py checks it against
// autograd through recurrent.gru_scan.
//
// The input gates gi = x W_ih^T + b_ih (B, T, 3 Hd) come in computed (one matmul, outside). Per
// step, PyTorch's GRU cell (r, z, n), with the stream's masks as gru_scan has them:
//   h_in = reset ? 0 : h,  gh = W_hh h_in + b_hh,
//   r = sigmoid(gi_r + gh_r),  z = sigmoid(gi_z + gh_z),  n = tanh(gi_n + r gh_n),
//   h = valid ? (1 - z) n + z h_in : h_in.
// In PyTorch each step is a dozen ops and as many autograd nodes; here plain loops (axpys over
// contiguous rows), the backward the adjoint of the same steps, dW_hh one matrix product at the end.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <tuple>
#include <vector>

namespace {

template <typename T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

void check(const torch::Tensor& gi, const torch::Tensor& h0, const torch::Tensor& w_hh, const torch::Tensor& b_hh,
           const torch::Tensor& reset, const torch::Tensor& valid) {
  TORCH_CHECK(gi.dim() == 3 && h0.dim() == 2 && w_hh.dim() == 2 && b_hh.dim() == 1,
              "gi (B, T, 3 Hd), h0 (B, Hd), w_hh (3 Hd, Hd), b_hh (3 Hd)");
  const int64_t B = gi.size(0), T = gi.size(1), Hd = h0.size(1);
  TORCH_CHECK(gi.size(2) == 3 * Hd && h0.size(0) == B && w_hh.size(0) == 3 * Hd && w_hh.size(1) == Hd &&
                  b_hh.size(0) == 3 * Hd,
              "gi (B, T, 3 Hd), h0 (B, Hd), w_hh (3 Hd, Hd), b_hh (3 Hd)");
  TORCH_CHECK(reset.sizes() == torch::IntArrayRef({B, T}) && valid.sizes() == torch::IntArrayRef({B, T}) &&
                  reset.scalar_type() == at::kBool && valid.scalar_type() == at::kBool,
              "reset and valid: (B, T) bool");
  TORCH_CHECK(gi.scalar_type() == at::kFloat || gi.scalar_type() == at::kDouble, "gi must be float32 or float64");
  for (const auto* t : {&h0, &w_hh, &b_hh}) TORCH_CHECK(t->scalar_type() == gi.scalar_type(), "h0 and the weights: gi's dtype");
  for (const auto* t : {&gi, &h0, &w_hh, &b_hh, &reset, &valid}) TORCH_CHECK(t->device().is_cpu(), "CPU tensors");
}

// (states (B, T, Hd); kept for the backward: h_in (B, T, Hd) and r, z, n, gh_n (B, T, 4, Hd)).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> gru_recurrence(const torch::Tensor& gi_, const torch::Tensor& h0_,
                                                                      const torch::Tensor& w_hh, const torch::Tensor& b_hh_,
                                                                      const torch::Tensor& reset_, const torch::Tensor& valid_) {
  check(gi_, h0_, w_hh, b_hh_, reset_, valid_);
  const int64_t B = gi_.size(0), T = gi_.size(1), Hd = h0_.size(1);
  const auto gi = gi_.contiguous(), h0 = h0_.contiguous(), wT = w_hh.t().contiguous(), b_hh = b_hh_.contiguous();
  const auto reset = reset_.contiguous(), valid = valid_.contiguous();
  auto states = torch::empty({B, T, Hd}, gi.options()), h_in = torch::empty({B, T, Hd}, gi.options());
  auto gates = torch::empty({B, T, 4, Hd}, gi.options());
  AT_DISPATCH_FLOATING_TYPES(gi.scalar_type(), "gru_recurrence", [&] {
    using S = scalar_t;
    const S *gp = gi.data_ptr<S>(), *wt = wT.data_ptr<S>(), *bh = b_hh.data_ptr<S>(), *hp0 = h0.data_ptr<S>();
    const bool *rs = reset.data_ptr<bool>(), *vd = valid.data_ptr<bool>();
    S *out = states.data_ptr<S>(), *hin = h_in.data_ptr<S>(), *gt = gates.data_ptr<S>();
    at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
      std::vector<S> h(Hd), gh(3 * Hd);
      for (int64_t b = begin; b < end; ++b) {
        std::copy(hp0 + b * Hd, hp0 + (b + 1) * Hd, h.begin());
        for (int64_t t = 0; t < T; ++t) {
          const int64_t row = b * T + t;
          if (rs[row]) std::fill(h.begin(), h.end(), S(0));
          S* hi = hin + row * Hd;
          std::copy(h.begin(), h.end(), hi);
          std::copy(bh, bh + 3 * Hd, gh.begin());
          for (int64_t i = 0; i < Hd; ++i) {
            const S x = h[i];
            const S* w = wt + i * 3 * Hd;
            for (int64_t k = 0; k < 3 * Hd; ++k) gh[k] += w[k] * x;
          }
          const S* g = gp + row * 3 * Hd;
          S* keep = gt + row * 4 * Hd;  // r, z, n, gh_n
          for (int64_t j = 0; j < Hd; ++j) {
            const S r = sigmoid(g[j] + gh[j]);
            const S z = sigmoid(g[Hd + j] + gh[Hd + j]);
            const S n = std::tanh(g[2 * Hd + j] + r * gh[2 * Hd + j]);
            keep[j] = r;
            keep[Hd + j] = z;
            keep[2 * Hd + j] = n;
            keep[3 * Hd + j] = gh[2 * Hd + j];
            if (vd[row]) h[j] = (S(1) - z) * n + z * h[j];
          }
          std::copy(h.begin(), h.end(), out + row * Hd);
        }
      }
    });
  });
  return {states, h_in, gates};
}

// (d gi (B, T, 3 Hd), d h0 (B, Hd), d w_hh (3 Hd, Hd), d b_hh (3 Hd)) from d states (B, T, Hd).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> gru_recurrence_backward(
    const torch::Tensor& grad_states, const torch::Tensor& h_in_, const torch::Tensor& gates_, const torch::Tensor& w_hh_,
    const torch::Tensor& reset_, const torch::Tensor& valid_) {
  const int64_t B = h_in_.size(0), T = h_in_.size(1), Hd = h_in_.size(2);
  TORCH_CHECK(grad_states.sizes() == h_in_.sizes() && gates_.sizes() == torch::IntArrayRef({B, T, 4, Hd}) &&
                  w_hh_.sizes() == torch::IntArrayRef({3 * Hd, Hd}) && reset_.sizes() == torch::IntArrayRef({B, T}) &&
                  valid_.sizes() == torch::IntArrayRef({B, T}),
              "grad_states, h_in (B, T, Hd), gates (B, T, 4, Hd), w_hh (3 Hd, Hd), reset and valid (B, T) of one forward");
  const auto dS = grad_states.contiguous(), h_in = h_in_.contiguous(), gates = gates_.contiguous();
  const auto w_hh = w_hh_.contiguous(), reset = reset_.contiguous(), valid = valid_.contiguous();
  auto dgi = torch::empty({B, T, 3 * Hd}, h_in.options()), dgh = torch::empty({B, T, 3 * Hd}, h_in.options());
  auto dh0 = torch::empty({B, Hd}, h_in.options());
  AT_DISPATCH_FLOATING_TYPES(h_in.scalar_type(), "gru_recurrence_backward", [&] {
    using S = scalar_t;
    const S *ds = dS.data_ptr<S>(), *hin = h_in.data_ptr<S>(), *gt = gates.data_ptr<S>(), *w = w_hh.data_ptr<S>();
    const bool *rs = reset.data_ptr<bool>(), *vd = valid.data_ptr<bool>();
    S *dgip = dgi.data_ptr<S>(), *dghp = dgh.data_ptr<S>(), *dh0p = dh0.data_ptr<S>();
    at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
      std::vector<S> carry(Hd), lam(Hd);
      for (int64_t b = begin; b < end; ++b) {
        std::fill(carry.begin(), carry.end(), S(0));  // dL/dh after the step being undone, from later steps
        for (int64_t t = T - 1; t >= 0; --t) {
          const int64_t row = b * T + t;
          const S *g = ds + row * Hd, *hi = hin + row * Hd, *keep = gt + row * 4 * Hd;
          S *dgi_r = dgip + row * 3 * Hd, *dgh_r = dghp + row * 3 * Hd;
          for (int64_t j = 0; j < Hd; ++j) lam[j] = g[j] + carry[j];
          if (!vd[row]) {  // h = h_in: the gradient passes, the gates have none
            std::fill(dgi_r, dgi_r + 3 * Hd, S(0));
            std::fill(dgh_r, dgh_r + 3 * Hd, S(0));
            std::copy(lam.begin(), lam.end(), carry.begin());
          } else {
            for (int64_t j = 0; j < Hd; ++j) {
              const S r = keep[j], z = keep[Hd + j], n = keep[2 * Hd + j], ghn = keep[3 * Hd + j], l = lam[j];
              const S dn = l * (S(1) - z) * (S(1) - n * n);  // through tanh
              const S dz = l * (hi[j] - n) * z * (S(1) - z);  // through sigmoid
              const S dr = dn * ghn * r * (S(1) - r);
              dgi_r[j] = dr;
              dgi_r[Hd + j] = dz;
              dgi_r[2 * Hd + j] = dn;
              dgh_r[j] = dr;
              dgh_r[Hd + j] = dz;
              dgh_r[2 * Hd + j] = dn * r;
              carry[j] = l * z;  // h_in's direct path
            }
            for (int64_t k = 0; k < 3 * Hd; ++k) {  // + W_hh^T dgh
              const S d = dgh_r[k];
              const S* wr = w + k * Hd;
              for (int64_t j = 0; j < Hd; ++j) carry[j] += wr[j] * d;
            }
          }
          if (rs[row]) std::fill(carry.begin(), carry.end(), S(0));  // h_in = 0: no path to earlier steps
        }
        std::copy(carry.begin(), carry.end(), dh0p + b * Hd);
      }
    });
  });
  const auto dgh2 = dgh.view({B * T, 3 * Hd});
  return {dgi, dh0, dgh2.t().mm(h_in.view({B * T, Hd})), dgh2.sum(0)};
}

}  // namespace

// Called from rope_cpu.cpp's module definition: one library holds every kernel.
void define_gru(pybind11::module_& m) {
  m.def("gru_recurrence", &gru_recurrence, "GRU steps from input gates: (states, h_in, gates kept for the backward)");
  m.def("gru_recurrence_backward", &gru_recurrence_backward, "(d gi, d h0, d w_hh, d b_hh) from d states");
}
