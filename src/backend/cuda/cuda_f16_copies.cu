// f16 copies of weight matrices for prompt steps: how much room there is, which matrices get one, and
// making them with the prompt path's own dequantization (cuda_f16_copies.cuh).
#include "backend/cuda/cuda_f16_copies.cuh"

#include <algorithm>

#include "backend/cuda/cuda_kernels.cuh"
#include "core/log.h"

namespace roofline::cuda {

namespace {
constexpr double kGiB = 1073741824.0;
size_t copy_bytes(const DeviceWeight& w) { return ((size_t)w.rows * (size_t)w.cols * 2 + 255) / 256 * 256; }
bool is_own_copy(const DeviceWeight& w) { return w.type == DType::F16 && w.layout == WeightLayout::Raw && w.row_bytes == (size_t)w.cols * 2; }
}  // namespace

double f16_copy_room(double margin_bytes, double limit_bytes, double own_bytes, double cap_bytes) {
  size_t free_b = 0, total_b = 0;
  ROOFLINE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  double room = (double)free_b - margin_bytes;
  if (limit_bytes > 0) room = std::min(room, limit_bytes - own_bytes - margin_bytes);
  if (cap_bytes > 0) room = std::min(room, cap_bytes);
  return std::max(0.0, room);
}

std::string make_f16_copies(const std::vector<DeviceWeight*>& weights, F16Copies mode, double room_bytes, DeviceArena& arena,
                            cudaStream_t stream, int device) {
  if (mode == F16Copies::Off || weights.empty()) return {};
  double need = 0;
  for (const DeviceWeight* w : weights)
    if (!is_own_copy(*w)) need += (double)copy_bytes(*w);
  if (mode == F16Copies::On && need > room_bytes)
    fail("--f16-copies on: the f16 copies of GPU {}'s {} weight matrices need {:.2f} GiB, and {:.2f} GiB are left after the weights, "
         "KV cache, work buffers and margin (use --f16-copies auto or off, a smaller -c, or fewer GPU layers)",
         device, weights.size(), need / kGiB, room_bytes / kGiB);
  // Which matrices get a copy: in order, while they fit.
  std::vector<DeviceWeight*> chosen;
  double taken = 0;
  int own = 0;
  for (DeviceWeight* w : weights) {
    if (is_own_copy(*w)) {
      ++own;
      continue;
    }
    const double b = (double)copy_bytes(*w);
    if (taken + b > room_bytes) continue;
    taken += b;
    chosen.push_back(w);
  }
  if (chosen.empty() && own == 0) {
    return fmt::format("GPU {}: no f16 copies of the weights for prompt steps ({:.2f} GiB would be needed, {:.2f} GiB are left)", device,
                       need / kGiB, room_bytes / kGiB);
  }
  if (taken > 0) arena.reserve((size_t)taken + 256);
  for (DeviceWeight* w : chosen) {
    __half* dst = reinterpret_cast<__half*>(arena.take(copy_bytes(*w)));
    dequant_rows_f16(*w, 0, w->rows, dst, stream);
    w->f16 = dst;
  }
  for (DeviceWeight* w : weights)
    if (is_own_copy(*w)) w->f16 = reinterpret_cast<const __half*>(w->data);
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  const size_t n = chosen.size() + (size_t)own;
  return fmt::format("GPU {}: f16 copies of {} of {} weight matrices kept for prompt steps, {:.2f} GiB{} (--f16-copies off leaves "
                     "that memory free; prompt products then dequantize their weights in every step)",
                     device, n, weights.size(), taken / kGiB, n < weights.size() ? fmt::format(" (all would need {:.2f} GiB)", need / kGiB) : "");
}

}  // namespace roofline::cuda
