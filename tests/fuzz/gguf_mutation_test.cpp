// Randomized mutation test of the GGUF reader, built with ASan/UBSan: mutates valid files (bit flips,
// byte/field overwrites, truncation, insertion, splicing) and parses each in memory for a bounded time.
// Every input must parse or fail with roofline::Error; any crash, sanitizer report or other exception fails.
// Usage: gguf_mutation_test [--seconds N] [--seed S]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"

using namespace roofline;

namespace {

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// A small valid file made here, so the test has seeds even without ../shared.
std::vector<uint8_t> make_seed(int variant) {
  gguf::Metadata md;
  md.set("general.architecture", gguf::Value::string("llama"));
  md.set("llama.block_count", gguf::Value::u32(1));
  md.set("general.alignment", gguf::Value::u32(variant ? 64 : 32));
  md.set("tokenizer.ggml.tokens", gguf::Value::string_array({"a", "b", "<s>"}));
  md.set("tokenizer.ggml.scores", gguf::Value::f32_array({0.1f, 0.2f, 0.3f}));
  md.set("some.bools", gguf::Value::bool_array({true, false}));
  md.set("some.f64", gguf::Value::f64(2.5));
  std::vector<uint8_t> data(4096, 7);
  std::vector<gguf::TensorInfo> tensors;
  const DType types[] = {DType::F32, DType::F16, DType::Q8_0, DType::Q4_K};
  for (int i = 0; i < 4; ++i) {
    gguf::TensorInfo t;
    t.name = "blk.0.t" + std::to_string(i) + ".weight";
    t.type = types[i];
    t.n_dims = 2;
    t.ne = {types[i] == DType::Q4_K ? 256 : 32, 2, 1, 1};
    t.data = data.data();
    tensors.push_back(t);
  }
  return gguf::serialize_gguf(md, tensors, variant ? 64 : 32);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 20;
  uint64_t seed = 12345;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--seed")) seed = std::strtoull(argv[i + 1], nullptr, 10);
  }

  std::vector<std::vector<uint8_t>> seeds = {make_seed(0), make_seed(1)};
  const std::string dirs[] = {std::string(ROOFLINE_SHARED_DIR) + "/testdata/models/llama-2-tiny-random-gguf",
                              std::string(ROOFLINE_SHARED_DIR) + "/testdata/models/qwen3-tiny512-llamacpp"};
  for (const std::string& dir : dirs) {
    if (DIR* d = opendir(dir.c_str())) {
      while (dirent* e = readdir(d)) {
        std::string n = e->d_name;
        if (n.size() > 5 && n.substr(n.size() - 5) == ".gguf" && (n.find("Q4_K_M") != std::string::npos ||
                                                                   n.find("Q2_K") != std::string::npos ||
                                                                   n.find("llama-2") != std::string::npos)) {
          seeds.push_back(read_file(dir + "/" + n));
        }
      }
      closedir(d);
    }
  }
  // Every seed must parse cleanly first.
  for (auto& s : seeds) {
    try {
      gguf::GgufFile::parse("seed", s.data(), s.size());
    } catch (const Error& e) {
      std::fprintf(stderr, "FAIL: a seed file does not parse: %s\n", e.what());
      return 1;
    }
  }

  std::mt19937_64 rng(seed);
  auto rand_below = [&](size_t n) { return n ? (size_t)(rng() % n) : 0; };
  const auto start = std::chrono::steady_clock::now();
  size_t iterations = 0, accepted = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    const auto& base = seeds[rand_below(seeds.size())];
    // Mutate mostly the header region, where the parser's decisions are.
    const size_t header_span = std::min<size_t>(base.size(), 1 << 16);
    std::vector<uint8_t> buf = base;
    const int n_mut = 1 + (int)rand_below(4);
    for (int m = 0; m < n_mut; ++m) {
      switch (rand_below(7)) {
        case 0: buf[rand_below(std::min(buf.size(), header_span))] ^= (uint8_t)(1u << rand_below(8)); break;
        case 1: buf[rand_below(std::min(buf.size(), header_span))] = (uint8_t)rng(); break;
        case 2: {  // overwrite a 4- or 8-byte field with an interesting value
          static const uint64_t interesting[] = {0, 1, 2, 3, 4, 31, 32, 63, 64, 255, 0x7fffffff, 0x80000000,
                                                 0xffffffff, 0x7fffffffffffffffull, 0xffffffffffffffffull, 1ull << 40};
          const uint64_t v = interesting[rand_below(std::size(interesting))];
          const size_t w = rand_below(2) ? 4 : 8;
          if (buf.size() > w) std::memcpy(buf.data() + rand_below(std::min(buf.size(), header_span) - w), &v, w);
          break;
        }
        case 3: buf.resize(rand_below(buf.size() + 1)); break;
        case 4: {
          const size_t at = rand_below(std::min(buf.size(), header_span) + 1);
          buf.insert(buf.begin() + (ptrdiff_t)at, 1 + rand_below(16), (uint8_t)rng());
          break;
        }
        case 5: {
          if (buf.size() > 16) {
            const size_t at = rand_below(std::min(buf.size(), header_span) - 8);
            buf.erase(buf.begin() + (ptrdiff_t)at, buf.begin() + (ptrdiff_t)(at + 1 + rand_below(8)));
          }
          break;
        }
        case 6: {  // splice from another seed
          const auto& other = seeds[rand_below(seeds.size())];
          if (!other.empty() && !buf.empty()) {
            const size_t from = rand_below(std::min(other.size(), header_span));
            const size_t to = rand_below(std::min(buf.size(), header_span));
            const size_t len = std::min({(size_t)1 + rand_below(64), other.size() - from, buf.size() - to});
            std::memcpy(buf.data() + to, other.data() + from, len);
          }
          break;
        }
      }
    }
    // Exact-size heap copy so ASan sees any read past the end.
    std::unique_ptr<uint8_t[]> exact(new uint8_t[buf.size() ? buf.size() : 1]);
    if (!buf.empty()) std::memcpy(exact.get(), buf.data(), buf.size());
    try {
      auto file = gguf::GgufFile::parse("mutant", exact.get(), buf.size());
      volatile uint8_t sink = 0;
      for (const auto& t : file->tensors())
        if (t.n_bytes) sink ^= t.data[0] ^ t.data[t.n_bytes - 1];
      for (const auto& [k, v] : file->metadata().entries()) (void)v.to_display();
      (void)sink;
      ++accepted;
    } catch (const Error&) {
      // expected for most mutants
    } catch (const std::exception& e) {
      std::fprintf(stderr, "FAIL: non-Error exception after %zu iterations: %s\n", iterations, e.what());
      return 1;
    }
    ++iterations;
  }
  std::printf("gguf mutation test: %zu mutants parsed in %.0f s (%zu accepted, %zu rejected with an Error), %zu seeds\n",
              iterations, seconds, accepted, iterations - accepted, seeds.size());
  return 0;
}
