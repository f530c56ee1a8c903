// The CPU's elementwise ops against double-precision maths: the gated activations of the feed-forward
// blocks (silu(g) * u and gelu_tanh(g) * u, AVX-512 and scalar forms) on odd lengths and extreme inputs,
// and rms_norm's lane sums on lengths with and without a tail.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/vec_dot.h"
#include "core/rng.h"

namespace roofline::cpu {
namespace {

double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
double gelu_tanh_ref(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608 * (x + 0.044715 * x * x * x))); }

std::vector<float> test_inputs(size_t n, Rng& rng) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = (float)(rng.uniform() * 24.0 - 12.0);
  // Extremes where exp over- or underflows, zero and tiny values.
  const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 87.0f, -87.0f, 89.0f, -89.0f, 200.0f, -200.0f, 1e30f, -1e30f};
  for (size_t i = 0; i < sizeof(special) / sizeof(special[0]) && i < n; ++i) g[i * 3 % n] = special[i];
  return g;
}

void check_gated(bool geglu, size_t n) {
  Rng rng(7 + n);
  const std::vector<float> g0 = test_inputs(n, rng);
  std::vector<float> u(n);
  for (float& v : u) v = (float)(rng.uniform() * 4.0 - 2.0);
  std::vector<float> g = g0;
  gated_activation(g.data(), u.data(), n, geglu);
  for (size_t i = 0; i < n; ++i) {
    const double ref = (geglu ? gelu_tanh_ref(g0[i]) : silu_ref(g0[i])) * (double)u[i];
    // A few ulps of the result; the scalar GELU's 1 + tanh(y) also loses ~1 ulp of 0.5 |x u| where tanh nears -1.
    const double tol = 2e-6 * std::abs(ref) + (geglu ? 1e-7 * std::abs((double)g0[i] * u[i]) : 0.0) + 1e-35;
    ASSERT_TRUE(std::isfinite(g[i])) << "n " << n << " i " << i << " x " << g0[i];
    EXPECT_NEAR(g[i], ref, tol) << (geglu ? "geglu" : "swiglu") << " n " << n << " i " << i << " x " << g0[i];
  }
  // Any split gives the same bits: the last 5 elements alone.
  if (n > 5) {
    std::vector<float> tail(g0.end() - 5, g0.end());
    gated_activation(tail.data(), u.data() + n - 5, 5, geglu);
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(tail[i], g[n - 5 + i]) << "n " << n << " tail " << i;
  }
}

TEST(CpuActivation, GatedActivationsMatchDoubleMaths) {
  for (size_t n : {1, 5, 16, 17, 100, 1027})
    for (bool geglu : {false, true}) check_gated(geglu, n);
}

TEST(CpuActivation, RmsNormMatchesDoubleMaths) {
  Rng rng(3);
  for (int n : {1, 15, 16, 33, 128, 2049}) {
    std::vector<float> x(n), w(n), y(n);
    for (int i = 0; i < n; ++i) {
      x[i] = (float)(rng.uniform() * 8.0 - 4.0);
      w[i] = (float)(rng.uniform() * 2.0);
    }
    rms_norm(x.data(), w.data(), y.data(), n, 1e-6f);
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += (double)x[i] * x[i];
    const double scale = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i] * scale * w[i], 1e-5 * std::abs(x[i] * scale * w[i]) + 1e-7) << "n " << n << " i " << i;
  }
}

}  // namespace
}  // namespace roofline::cpu
