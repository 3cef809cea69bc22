// posenc: FLOATER's fixed-step RK4 solve of dp/dt = W2 tanh(W1p p + t w1t + b1) + b2, forward
// and backward (the discrete adjoint of the same steps), on CPU, float32 or float64. Compiled into
// the fused CPU kernel library (posenc/rotary/cpu_rope.py); posenc/absolute/floater.py calls it,
// tests/test_floater_cpu_kernel.py checks it against autograd through posenc.absolute.floater.rk4.
//
// A step is a few small matrix-vector products (hidden x C); in PyTorch each is an op with its
// dispatch and autograd node, thousands per solve. Here a step is plain loops, written as axpys
// over contiguous rows so the compiler vectorises them without reassociating a sum.
//
// Step k (t = k dt) from y: s1 = y, s2 = y + dt/2 k1, s3 = y + dt/2 k2, s4 = y + dt k3, with
// k_j = h(s_j, t_j) (t_1 = t, t_2 = t_3 = t + dt/2, t_4 = t + dt), and
// y' = y + dt/6 (k1 + 2 k2 + 2 k3 + k4). The forward keeps each stage's input s_j and tanh a_j;
// the backward runs the steps in reverse, and the weights' gradients are two matrix products
// over every stage at the end.
#include <torch/extension.h>

#include <cmath>
#include <tuple>
#include <vector>

namespace {

template <typename T>
struct Mlp {
  const T* w1pT;  // (C, Hd): W1p transposed
  const T* w1p;   // (Hd, C)
  const T* w1t;   // (Hd,)
  const T* b1;    // (Hd,)
  const T* w2T;   // (Hd, C): W2 transposed
  const T* w2;    // (C, Hd)
  const T* b2;    // (C,)
  int64_t C, Hd;

  // out = h(s, t); a = tanh(W1p s + t w1t + b1), kept for the backward.
  void forward(const T* s, T t, T* a, T* out) const {
    for (int64_t j = 0; j < Hd; ++j) a[j] = b1[j] + t * w1t[j];
    for (int64_t i = 0; i < C; ++i) {
      const T si = s[i];
      const T* w = w1pT + i * Hd;
      for (int64_t j = 0; j < Hd; ++j) a[j] += w[j] * si;
    }
    for (int64_t j = 0; j < Hd; ++j) a[j] = std::tanh(a[j]);
    for (int64_t c = 0; c < C; ++c) out[c] = b2[c];
    for (int64_t j = 0; j < Hd; ++j) {
      const T aj = a[j];
      const T* w = w2T + j * C;
      for (int64_t c = 0; c < C; ++c) out[c] += w[c] * aj;
    }
  }

  // From g_out = dL/dh at a stage whose tanh was a: gz = dL/dz (Hd), and gs += dL/ds (C).
  void backward(const T* g_out, const T* a, T* gz, T* gs) const {
    for (int64_t j = 0; j < Hd; ++j) gz[j] = 0;
    for (int64_t c = 0; c < C; ++c) {
      const T g = g_out[c];
      const T* w = w2 + c * Hd;
      for (int64_t j = 0; j < Hd; ++j) gz[j] += w[j] * g;
    }
    for (int64_t j = 0; j < Hd; ++j) gz[j] *= T(1) - a[j] * a[j];
    for (int64_t j = 0; j < Hd; ++j) {
      const T g = gz[j];
      const T* w = w1p + j * C;
      for (int64_t i = 0; i < C; ++i) gs[i] += w[i] * g;
    }
  }
};

void check_weights(const torch::Tensor& y0, const torch::Tensor& w1, const torch::Tensor& b1, const torch::Tensor& w2,
                   const torch::Tensor& b2) {
  TORCH_CHECK(y0.dim() == 1 && w1.dim() == 2 && b1.dim() == 1 && w2.dim() == 2 && b2.dim() == 1,
              "y0 (C,), w1 (Hd, C + 1), b1 (Hd,), w2 (C, Hd), b2 (C,)");
  const int64_t C = y0.size(0), Hd = b1.size(0);
  TORCH_CHECK(w1.size(0) == Hd && w1.size(1) == C + 1 && w2.size(0) == C && w2.size(1) == Hd && b2.size(0) == C,
              "y0 (C,), w1 (Hd, C + 1), b1 (Hd,), w2 (C, Hd), b2 (C,)");
  for (const auto* t : {&w1, &b1, &w2, &b2})
    TORCH_CHECK(t->scalar_type() == y0.scalar_type() && t->device().is_cpu(), "weights: y0's dtype, on CPU");
  TORCH_CHECK(y0.device().is_cpu() && (y0.scalar_type() == at::kFloat || y0.scalar_type() == at::kDouble),
              "y0 must be a float32 or float64 CPU tensor");
}

// Contiguous copies of the weights in both layouts the loops read (a few kB).
struct Weights {
  torch::Tensor w1p, w1pT, w1t, b1, w2, w2T, b2;
  Weights(const torch::Tensor& w1, const torch::Tensor& b1_, const torch::Tensor& w2_, const torch::Tensor& b2_) {
    const int64_t C = w1.size(1) - 1;
    w1p = w1.narrow(1, 0, C).contiguous();
    w1pT = w1p.t().contiguous();
    w1t = w1.select(1, C).contiguous();
    b1 = b1_.contiguous();
    w2 = w2_.contiguous();
    w2T = w2.t().contiguous();
    b2 = b2_.contiguous();
  }
  template <typename T>
  Mlp<T> mlp() const {
    return {w1pT.data_ptr<T>(), w1p.data_ptr<T>(), w1t.data_ptr<T>(), b1.data_ptr<T>(),
            w2T.data_ptr<T>(),  w2.data_ptr<T>(),  b2.data_ptr<T>(),  w2.size(0), w2.size(1)};
  }
};

constexpr double kStageTime[4] = {0.0, 0.5, 0.5, 1.0};  // t_j = t + kStageTime[j] dt
constexpr double kStageFrom[4] = {0.0, 0.5, 0.5, 1.0};  // s_j = y + kStageFrom[j] dt k_{j-1}

// (states (N, C): y after every step; stages (N, 4, C): each stage's input; acts (N, 4, Hd)).
template <typename T>
void solve(const Mlp<T>& m, const T* y0, double dt, int64_t steps, int64_t start, T* states, T* stages, T* acts) {
  const int64_t C = m.C, Hd = m.Hd;
  std::vector<T> y(y0, y0 + C), k(4 * C);
  for (int64_t n = 0; n < steps; ++n) {
    const T t = T(double(start + n) * dt);  // from the integer step, as rk4 computes it
    for (int64_t j = 0; j < 4; ++j) {
      T* s = stages + (n * 4 + j) * C;
      const T from = T(kStageFrom[j] * dt);
      for (int64_t i = 0; i < C; ++i) s[i] = j == 0 ? y[i] : y[i] + from * k[(j - 1) * C + i];
      m.forward(s, T(t + T(kStageTime[j] * dt)), acts + (n * 4 + j) * Hd, k.data() + j * C);
    }
    const T sixth = T(dt / 6.0);
    T* out = states + n * C;
    for (int64_t i = 0; i < C; ++i) {
      y[i] = y[i] + sixth * (k[i] + T(2) * k[C + i] + T(2) * k[2 * C + i] + k[3 * C + i]);
      out[i] = y[i];
    }
  }
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> floater_rk4(const torch::Tensor& y0, const torch::Tensor& w1,
                                                                   const torch::Tensor& b1, const torch::Tensor& w2,
                                                                   const torch::Tensor& b2, double dt, int64_t steps,
                                                                   int64_t start) {
  check_weights(y0, w1, b1, w2, b2);
  TORCH_CHECK(steps >= 0 && start >= 0, "steps and start must be >= 0");
  const int64_t C = y0.size(0), Hd = b1.size(0);
  auto opts = y0.options();
  auto states = torch::empty({steps, C}, opts), stages = torch::empty({steps, 4, C}, opts);
  auto acts = torch::empty({steps, 4, Hd}, opts);
  const Weights w(w1, b1, w2, b2);
  const auto y = y0.contiguous();
  AT_DISPATCH_FLOATING_TYPES(y0.scalar_type(), "floater_rk4", [&] {
    solve<scalar_t>(w.mlp<scalar_t>(), y.data_ptr<scalar_t>(), dt, steps, start, states.data_ptr<scalar_t>(),
                    stages.data_ptr<scalar_t>(), acts.data_ptr<scalar_t>());
  });
  return {states, stages, acts};
}

// dL/dy0 and the weights' gradients (w1 (Hd, C + 1), b1, w2, b2) from dL/d(states) (N, C).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> floater_rk4_backward(
    const torch::Tensor& grad_states, const torch::Tensor& stages, const torch::Tensor& acts, const torch::Tensor& y0,
    const torch::Tensor& w1, const torch::Tensor& b1, const torch::Tensor& w2, const torch::Tensor& b2, double dt,
    int64_t start) {
  check_weights(y0, w1, b1, w2, b2);
  const int64_t steps = stages.size(0), C = y0.size(0), Hd = b1.size(0);
  TORCH_CHECK(grad_states.sizes() == torch::IntArrayRef({steps, C}) && stages.sizes() == torch::IntArrayRef({steps, 4, C}) &&
                  acts.sizes() == torch::IntArrayRef({steps, 4, Hd}),
              "grad_states (N, C), stages (N, 4, C), acts (N, 4, Hd) of one solve");
  auto opts = y0.options();
  auto g_out = torch::empty({steps, 4, C}, opts), g_z = torch::empty({steps, 4, Hd}, opts);
  auto gy0 = torch::empty({C}, opts), times = torch::empty({steps, 4}, opts);
  const Weights w(w1, b1, w2, b2);
  const auto gs_in = grad_states.contiguous(), st = stages.contiguous(), ac = acts.contiguous();
  AT_DISPATCH_FLOATING_TYPES(y0.scalar_type(), "floater_rk4_backward", [&] {
    using T = scalar_t;
    const Mlp<T> m = w.mlp<T>();
    const T* gstates = gs_in.data_ptr<T>();
    const T* a = ac.data_ptr<T>();
    T *go = g_out.data_ptr<T>(), *gz = g_z.data_ptr<T>(), *tm = times.data_ptr<T>();
    std::vector<T> lam(C, T(0)), gk(C), gs(C);
    const T sixth = T(dt / 6.0), third = T(dt / 3.0);
    const T weight[4] = {sixth, third, third, sixth};  // dy'/dk_j
    for (int64_t n = steps - 1; n >= 0; --n) {
      const T t = T(double(start + n) * dt);
      const T* g = gstates + n * C;
      for (int64_t i = 0; i < C; ++i) lam[i] += g[i];
      // Stages in reverse: dL/dk_j = weight_j lam + (from the next stage's input) from_{j+1} dt dL/ds_{j+1}.
      std::fill(gs.begin(), gs.end(), T(0));  // dL/ds_{j+1}, none after the last stage
      std::vector<T> gy(lam);                 // dL/dy of this step's start: the identity path, then each s_j
      for (int64_t j = 3; j >= 0; --j) {
        const T from_next = j < 3 ? T(kStageFrom[j + 1] * dt) : T(0);
        T* out = go + (n * 4 + j) * C;
        for (int64_t i = 0; i < C; ++i) out[i] = weight[j] * lam[i] + from_next * gs[i];
        std::fill(gs.begin(), gs.end(), T(0));
        m.backward(out, a + (n * 4 + j) * Hd, gz + (n * 4 + j) * Hd, gs.data());
        for (int64_t i = 0; i < C; ++i) gy[i] += gs[i];
        tm[n * 4 + j] = T(t + T(kStageTime[j] * dt));
      }
      lam.swap(gy);
    }
    std::copy(lam.begin(), lam.end(), gy0.data_ptr<T>());
  });
  // The weights: sums over every stage of every step.
  const auto go2 = g_out.view({steps * 4, C}), gz2 = g_z.view({steps * 4, Hd});
  const auto a2 = ac.view({steps * 4, Hd}), s2 = st.view({steps * 4, C});
  auto gw1 = torch::cat({gz2.t().mm(s2), gz2.t().mv(times.view({steps * 4})).unsqueeze(1)}, 1);  // (Hd, C + 1)
  return {gy0, gw1, gz2.sum(0), go2.t().mm(a2), go2.sum(0)};
}

}  // namespace

// Called from rope_cpu.cpp's module definition: one library holds every kernel.
void define_floater(pybind11::module_& m) {
  m.def("floater_rk4", &floater_rk4, "RK4 solve: (states (N, C), stage inputs (N, 4, C), tanh (N, 4, Hd))");
  m.def("floater_rk4_backward", &floater_rk4_backward, "(dy0, dw1, db1, dw2, db2) from dL/d(states)");
}
