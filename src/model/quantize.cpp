// The streaming quantizer: plan (types, order, metadata as llama-quantize writes them), then convert
// each tensor in chunks of rows spread over a thread pool, validate the rows, and stream them into a
// GgufWriter (temporary file renamed by finish(); removed by its destructor on any error).
#include "model/quantize.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "formats/quant_blocks.h"
#include "formats/quant_ref.h"

namespace roofline {
namespace {

int layer_number(const std::string& name) {
  int layer = -1;
  return std::sscanf(name.c_str(), "blk.%d.", &layer) == 1 ? layer : -1;
}

// An integer hyperparameter that may be stored as a per-layer array (then its largest value).
int int_hparam(const gguf::Metadata& md, const std::string& key, int fallback) {
  const gguf::Value* v = md.find(key);
  if (!v) return fallback;
  if (v->is_array()) {
    int64_t best = fallback;
    for (int64_t x : v->as_int_array(key)) best = std::max(best, x);
    return (int)best;
  }
  return (int)v->as_int(key);
}

// Asks the kernel to reclaim the pages of an input range already consumed (clean file pages are
// dropped and re-read if touched again; MADV_PAGEOUT never loses data, so memory images are safe
// too), so the resident memory stays near one chunk whatever the model size.
void release_input(const gguf::GgufFile& in, const uint8_t* p, size_t n) {
#ifdef MADV_PAGEOUT
  if (in.in_memory() || n == 0) return;
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + n) / page * page;
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_PAGEOUT);
#else
  (void)in, (void)p, (void)n;
#endif
}

bool half_is_finite(uint16_t h) { return (h & 0x7c00) != 0x7c00; }
bool bf16_is_finite(uint16_t h) { return (h & 0x7f80) != 0x7f80; }

// Checks the f16 fields at `offsets` (bytes) of every block.
bool check_block_halves(const uint8_t* p, size_t n_bytes, size_t block_bytes, std::initializer_list<size_t> offsets,
                        size_t* where) {
  const size_t n_blocks = n_bytes / block_bytes;
  for (size_t b = 0; b < n_blocks; ++b) {
    for (size_t off : offsets) {
      uint16_t h;
      std::memcpy(&h, p + b * block_bytes + off, 2);
      if (!half_is_finite(h)) {
        if (where) *where = b;
        return false;
      }
    }
  }
  return true;
}

}  // namespace

bool quantize_tensor_order(const std::string& a, const std::string& b) {
  const int la = layer_number(a), lb = layer_number(b);
  return la != lb ? la < lb : a < b;
}

bool validate_row_data(DType type, const void* data, size_t n_bytes, size_t* where) {
  const auto* p = static_cast<const uint8_t*>(data);
  switch (type) {
    case DType::F32: {
      for (size_t i = 0; i < n_bytes / 4; ++i) {
        float f;
        std::memcpy(&f, p + 4 * i, 4);
        if (!std::isfinite(f)) {
          if (where) *where = i;
          return false;
        }
      }
      return true;
    }
    case DType::F16:
    case DType::BF16: {
      for (size_t i = 0; i < n_bytes / 2; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        if (!(type == DType::F16 ? half_is_finite(h) : bf16_is_finite(h))) {
          if (where) *where = i;
          return false;
        }
      }
      return true;
    }
    case DType::Q4_0: return check_block_halves(p, n_bytes, sizeof(BlockQ4_0), {offsetof(BlockQ4_0, d)}, where);
    case DType::Q4_1: return check_block_halves(p, n_bytes, sizeof(BlockQ4_1), {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)}, where);
    case DType::Q5_0: return check_block_halves(p, n_bytes, sizeof(BlockQ5_0), {offsetof(BlockQ5_0, d)}, where);
    case DType::Q5_1: return check_block_halves(p, n_bytes, sizeof(BlockQ5_1), {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)}, where);
    case DType::Q8_0: return check_block_halves(p, n_bytes, sizeof(BlockQ8_0), {offsetof(BlockQ8_0, d)}, where);
    case DType::IQ4_NL: return check_block_halves(p, n_bytes, sizeof(BlockIQ4_NL), {offsetof(BlockIQ4_NL, d)}, where);
    case DType::Q2_K: return check_block_halves(p, n_bytes, sizeof(BlockQ2_K), {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)}, where);
    case DType::Q3_K: return check_block_halves(p, n_bytes, sizeof(BlockQ3_K), {offsetof(BlockQ3_K, d)}, where);
    case DType::Q4_K: return check_block_halves(p, n_bytes, sizeof(BlockQ4_K), {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)}, where);
    case DType::Q5_K: return check_block_halves(p, n_bytes, sizeof(BlockQ5_K), {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)}, where);
    case DType::Q6_K: return check_block_halves(p, n_bytes, sizeof(BlockQ6_K), {offsetof(BlockQ6_K, d)}, where);
    case DType::IQ4_XS: return check_block_halves(p, n_bytes, sizeof(BlockIQ4_XS), {offsetof(BlockIQ4_XS, d)}, where);
    default: return true;
  }
}

void convert_rows(DType src_type, const void* src, DType dst_type, void* dst, int64_t n_rows, int64_t row_length,
                  const float* importance, const std::string& what, int64_t row_offset) {
  thread_local std::vector<float> scratch;
  const size_t in_row = dtype_row_bytes(src_type, row_length), out_row = dtype_row_bytes(dst_type, row_length);
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* s = in + (size_t)r * in_row;
    const float* f;
    if (src_type == DType::F32 && reinterpret_cast<uintptr_t>(s) % alignof(float) == 0) {
      f = reinterpret_cast<const float*>(s);
    } else {
      scratch.resize((size_t)row_length);
      dequantize_row_ref(src_type, s, scratch.data(), row_length);
      f = scratch.data();
    }
    for (int64_t j = 0; j < row_length; ++j)
      if (!std::isfinite(f[j]))
        fail("{}: row {} holds a non-finite value ({}) at column {}; the input is damaged", what, row_offset + r, f[j], j);
    uint8_t* d = out + (size_t)r * out_row;
    quantize_row_ref(dst_type, f, d, row_length, importance);
    size_t where = 0;
    if (!validate_row_data(dst_type, d, out_row, &where))
      fail("{}: row {} converted to {} has a NaN or Inf {} {} (the input holds non-finite or out-of-range values)", what,
           row_offset + r, dtype_name(dst_type), dtype_traits(dst_type).quantized ? "scale in block" : "value at", where);
  }
}

QuantizePlan plan_quantization(const gguf::GgufFile& in, const QuantizeOptions& options) {
  if (!options.mix) fail("no quantization type given");
  const gguf::Metadata& md = in.metadata();
  if (md.get_string_or("general.type", "") == "imatrix")
    fail("{}: this is an importance matrix, not a model", in.name());
  const std::string arch = md.get_string_or("general.architecture", "");
  if (arch.empty()) fail("{}: not a model file (no general.architecture key)", in.name());
  if (in.tensors().empty()) fail("{}: the file holds no tensors", in.name());

  std::vector<const gguf::TensorInfo*> order;
  for (const gguf::TensorInfo& t : in.tensors()) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](const gguf::TensorInfo* a, const gguf::TensorInfo* b) { return quantize_tensor_order(a->name, b->name); });
  std::vector<std::string> names;
  for (const gguf::TensorInfo* t : order) names.push_back(t->name);

  const int n_head = int_hparam(md, arch + ".attention.head_count", 1);
  MixOptions mopts = options.mix_options;
  mopts.has_imatrix = options.imatrix != nullptr;
  MixPlanner planner(*options.mix,
                     mix_model_info(arch, int_hparam(md, arch + ".block_count", 0), n_head,
                                    int_hparam(md, arch + ".attention.head_count_kv", n_head),
                                    int_hparam(md, arch + ".expert_count", 0), names),
                     mopts);

  QuantizePlan plan;
  for (const gguf::TensorInfo* t : order) {
    // A dimension of 0 leaves rows of no bytes to convert (and nothing a model could use).
    for (int d = 0; d < t->n_dims; ++d)
      if (t->ne[(size_t)d] == 0) fail("{}: tensor '{}' has a dimension of 0 (shape {})", in.name(), t->name, t->shape_string());
    TensorPlan p;
    p.name = t->name;
    p.from = t->type;
    p.n_dims = t->n_dims;
    p.ne = t->ne;
    p.in_bytes = t->n_bytes;
    p.source = t;
    p.to = planner.type_for(t->name, t->type, t->ne, t->n_dims);
    if (options.leave_output_tensor && t->name == "output.weight") p.to = t->type;
    p.convert = p.to != p.from;
    if (p.convert) {
      if (dtype_traits(p.from).quantized && !options.allow_requantize)
        fail("{}: tensor '{}' is already quantized ({}); requantizing loses quality, so it is refused: quantize from "
             "the F16/BF16/F32 model, or pass --allow-requantize",
             in.name(), t->name, dtype_name(p.from));
      if (!dtype_has_reference(p.from)) fail("{}: tensor '{}' has type {}, which roofline cannot convert", in.name(), t->name, dtype_name(p.from));
      if (!dtype_has_reference(p.to)) fail("cannot quantize tensor '{}' to {}: roofline has no quantizer for it", t->name, dtype_name(p.to));
    }
    p.out_bytes = gguf::tensor_bytes(p.to, p.ne);
    if (p.convert && options.imatrix && dtype_traits(p.to).quantized) {
      auto it = options.imatrix->values.find(t->name);
      if (it == options.imatrix->values.end()) {
        plan.missing_imatrix.push_back(t->name);
      } else {
        const size_t expected = (size_t)(t->ne[0] * t->ne[2] * t->ne[3]);
        if (it->second.size() != expected)
          fail("the importance matrix entry for '{}' has {} values, the tensor needs {} ({} columns x {} matrices): "
               "was the imatrix computed for another model?",
               t->name, it->second.size(), expected, t->ne[0], t->ne[2] * t->ne[3]);
        p.uses_imatrix = true;
      }
    }
    plan.in_bytes += p.in_bytes;
    plan.out_bytes += p.out_bytes;
    plan.tensors.push_back(std::move(p));
  }
  plan.n_fallback = planner.fallback_count();

  // Metadata as llama-quantize writes it: everything kept, split keys dropped, the version and the
  // file type (re)appended at the end, then the imatrix provenance.
  plan.metadata = md;
  for (const char* key : {"split.no", "split.count", "split.tensors.count", "general.quantization_version", "general.file_type"})
    plan.metadata.erase(key);
  plan.metadata.set("general.quantization_version", gguf::Value::u32(2));
  plan.metadata.set("general.file_type", gguf::Value::u32((uint32_t)options.mix->file_type));
  if (options.imatrix) {
    const ImportanceData& im = *options.imatrix;
    plan.metadata.set("quantize.imatrix.file", gguf::Value::string(im.file));
    if (!im.dataset.empty()) plan.metadata.set("quantize.imatrix.dataset", gguf::Value::string(im.dataset));
    plan.metadata.set("quantize.imatrix.entries_count", gguf::Value::i32((int32_t)im.values.size()));
    if (im.chunk_count > 0) plan.metadata.set("quantize.imatrix.chunks_count", gguf::Value::i32(im.chunk_count));
  }
  return plan;
}

QuantizeResult quantize_model(const gguf::GgufFile& in, const std::string& out_path, const QuantizeOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto cancelled = [&] { return options.cancel && options.cancel->load(std::memory_order_relaxed); };

  if (!in.in_memory()) {
    std::error_code ec;
    if (std::filesystem::equivalent(in.name(), out_path, ec))
      fail("the output {} is the input file; write to another path", out_path);
  }
  QuantizeResult result;
  result.plan = plan_quantization(in, options);
  const QuantizePlan& plan = result.plan;

  std::vector<gguf::GgufWriter::TensorSpec> specs;
  for (const TensorPlan& p : plan.tensors) {
    if (!p.source->data && p.in_bytes > 0) fail("{}: tensor '{}' has no data (a layout-only model)", in.name(), p.name);
    specs.push_back({p.name, p.to, std::vector<int64_t>(p.ne.begin(), p.ne.begin() + p.n_dims)});
  }
  gguf::GgufWriter writer(out_path, plan.metadata, specs, in.alignment());

  // Work units for progress: elements converted, bytes copied (copying is far cheaper).
  auto cost = [](const TensorPlan& p) { return p.convert ? (double)p.source->n_elements() : p.in_bytes / 64.0; };
  double total_cost = 0, done_cost = 0;
  for (const TensorPlan& p : plan.tensors) total_cost += cost(p);
  if (total_cost <= 0) total_cost = 1;

  ThreadPool pool(options.n_threads > 0 ? options.n_threads : ThreadPool::default_thread_count());
  std::vector<uint8_t> buffer;
  const size_t chunk_bytes = std::max<size_t>(options.chunk_bytes, 4096);

  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorPlan& p = plan.tensors[i];
    QuantizeProgress pr;
    pr.tensor_index = i;
    pr.n_tensors = plan.tensors.size();
    pr.name = &p.name;
    pr.from = p.from;
    pr.to = p.to;
    auto report = [&](double fraction, bool done) {
      if (!options.progress) return;
      pr.tensor_fraction = fraction;
      pr.total_fraction = std::min(1.0, (done_cost + fraction * cost(p)) / total_cost);
      pr.elapsed_s = elapsed();
      pr.tensor_done = done;
      options.progress(pr);
    };
    if (cancelled()) fail("interrupted; no output was written");
    report(0, false);

    if (!p.convert) {
      for (size_t off = 0; off < p.in_bytes; off += chunk_bytes) {
        if (cancelled()) fail("interrupted; no output was written");
        const size_t n = std::min(chunk_bytes, p.in_bytes - off);
        writer.write_tensor_data(i, p.source->data + off, n);
        release_input(in, p.source->data + off, n);
        report((double)(off + n) / p.in_bytes, false);
      }
    } else {
      const int64_t row_length = p.ne[0];
      const int64_t n_rows = p.source->n_rows();
      const int64_t rows_per_matrix = p.ne[1];
      const size_t in_row = dtype_row_bytes(p.from, row_length), out_row = dtype_row_bytes(p.to, row_length);
      const int64_t chunk_rows = std::max<int64_t>(1, (int64_t)(chunk_bytes / std::max(out_row, in_row / 4)));
      const float* importance = nullptr;
      if (p.uses_imatrix) importance = options.imatrix->values.find(p.name)->second.data();
      for (int64_t r0 = 0; r0 < n_rows; r0 += chunk_rows) {
        if (cancelled()) fail("interrupted; no output was written");
        const int64_t r1 = std::min(n_rows, r0 + chunk_rows);
        buffer.resize((size_t)(r1 - r0) * out_row);
        const int64_t n_tasks = std::min<int64_t>(r1 - r0, (int64_t)pool.size() * 8);
        const int64_t per_task = (r1 - r0 + n_tasks - 1) / n_tasks;
        pool.parallel_for((size_t)n_tasks, [&](size_t task) {
          const int64_t a = r0 + (int64_t)task * per_task, b = std::min(r1, a + per_task);
          for (int64_t r = a; r < b;) {
            if (cancelled()) return;
            // Rows of one matrix (one expert) share its importance vector.
            const int64_t matrix = r / rows_per_matrix;
            const int64_t end = std::min(b, (matrix + 1) * rows_per_matrix);
            convert_rows(p.from, p.source->data + (size_t)r * in_row, p.to, buffer.data() + (size_t)(r - r0) * out_row,
                         end - r, row_length, importance ? importance + matrix * row_length : nullptr,
                         "tensor '" + p.name + "'", r);
            r = end;
          }
        });
        if (cancelled()) fail("interrupted; no output was written");
        writer.write_tensor_data(i, buffer.data(), buffer.size());
        release_input(in, p.source->data + (size_t)r0 * in_row, (size_t)(r1 - r0) * in_row);
        report((double)r1 / n_rows, false);
      }
    }
    report(1, true);
    done_cost += cost(p);
  }
  writer.finish();
  result.seconds = elapsed();
  return result;
}

}  // namespace roofline
