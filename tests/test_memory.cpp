// The memory budget (LoadOptions::max_memory_gib): the planner's choices for synthetic sizes,
// a budget too small failing before any work, streamed runs giving the same image, and the
// residency hint that streaming relies on (MADV_DONTNEED releasing a mapping's pages).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "api/memory_plan.h"
#include "api/memory_needs.h"
#include "core/host_memory.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "kernels/scratch.h"
#include "klein/klein.h"
#include "testing.h"

namespace fs = std::filesystem;
using klein::api::MemoryNeeds;
using klein::api::MemoryPlan;
using klein::api::plan_memory;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20, kGiB = uint64_t{1} << 30;

// Roughly klein 4B in bf16 at 1024²: a 5 GiB text encoder in 27 blocks, an 8 GiB transformer
// in 25 blocks, a 160 MiB VAE whose whole-image decode needs 3 GiB.
MemoryNeeds synthetic() {
  MemoryNeeds n;
  n.base = 100 * kMiB;
  n.scratch = 40 * kMiB;
  n.te = {5 * kGiB, 200 * kMiB, 10 * kMiB};
  n.dit = {8 * kGiB, 480 * kMiB, 400 * kMiB};
  n.te_activations = 100 * kMiB;
  n.dit_activations = 900 * kMiB;
  n.vae_weights = 160 * kMiB;
  n.vae_whole = 3 * kGiB;
  n.vae_tiled = [](int64_t tile) { return static_cast<uint64_t>(tile) * static_cast<uint64_t>(tile) * 3000 + 100 * kMiB; };
  return n;
}

using klein::testing::tiny;

klein::GenerateRequest small_request() {
  klein::GenerateRequest r;
  r.prompt = "a red fox";
  r.width = 48;
  r.height = 32;
  r.steps = 2;
  r.seed = 7;
  return r;
}

std::vector<uint8_t> png_of(const klein::Image& img) {
  auto r = klein::encode_image(img, klein::ImageFileFormat::kPng);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::vector<uint8_t>{};
}

// Opens `dir` under a budget whose plan is forced to stream the text encoder and the transformer
// block by block (the tiled VAE equals the whole one to rounding, not bits, so it stays whole),
// and generates small_request(). Returns the result and the plan's log line; counts the plans
// made in *planned.
struct StreamedRun {
  klein::Result<klein::GenerateResult> result;
  std::string plan_line;
};
StreamedRun generate_streamed(const std::string& dir, klein::LoadOptions lo, int* planned = nullptr) {
  lo.max_memory_gib = 64;
  klein::api::set_plan_adjuster([planned](MemoryPlan& p) {
    p.stream_te = p.stream_dit = true;
    if (planned) ++*planned;
  });
  StreamedRun run{klein::Status(klein::Code::kInternal, "not run"), {}};
  auto model = klein::Model::open(dir, lo);
  if (!model.ok()) {
    run.result = model.status();
  } else {
    klein::Callbacks cb;
    cb.log = [&](const std::string& s) { run.plan_line = s; };
    run.result = (*model)->generate(small_request(), cb);
  }
  klein::api::set_plan_adjuster({});
  return run;
}

}  // namespace

TEST(MemoryPlan, AmpleBudgetKeepsEverythingWhole) {
  auto p = plan_memory(synthetic(), 16 * kGiB);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_FALSE(p->stream_te);
  EXPECT_FALSE(p->stream_dit);
  EXPECT_EQ(p->vae_tile, 0);
  EXPECT_LE(p->peak(), 16 * kGiB);
}

TEST(MemoryPlan, MiddleBudgetStreamsWhatDoesNotFit) {
  // 9.5 GiB: the transformer's phase (8 GiB + activations) fits, so nothing streams; 6 GiB: only
  // the transformer is too big; 4 GiB: the 5 GiB text encoder too.
  auto only_dit = plan_memory(synthetic(), 6 * kGiB);
  ASSERT_TRUE(only_dit.ok()) << only_dit.status().to_string();
  EXPECT_FALSE(only_dit->stream_te);
  EXPECT_TRUE(only_dit->stream_dit);
  auto whole = plan_memory(synthetic(), 9728 * kMiB);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_FALSE(whole->stream_te);
  EXPECT_FALSE(whole->stream_dit);
  auto p = plan_memory(synthetic(), 4 * kGiB);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE(p->stream_te);
  EXPECT_TRUE(p->stream_dit);
  EXPECT_EQ(p->vae_tile, 0);  // 3 GiB + weights fit under 4 GiB
}

TEST(MemoryPlan, ResidentPolicyCountsEarlierPhases) {
  MemoryNeeds n = synthetic();
  n.resident = true;
  // 5 GiB text encoder kept while the 8 GiB transformer runs: streaming the encoder alone frees
  // enough at 10 GiB.
  auto p = plan_memory(n, 10 * kGiB);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE(p->stream_te);
  EXPECT_FALSE(p->stream_dit);
}

TEST(MemoryPlan, SmallBudgetTilesTheVaeAndKeepsUnderIt) {
  for (double g : {2.0, 1.95, 1.9}) {
    const uint64_t budget = static_cast<uint64_t>(g * kGiB);
    auto p = plan_memory(synthetic(), budget);
    ASSERT_TRUE(p.ok()) << g << ": " << p.status().to_string();
    EXPECT_TRUE(p->stream_te && p->stream_dit) << g;
    EXPECT_GT(p->vae_tile, 0) << g;
    EXPECT_LE(p->peak(), budget) << g;
    EXPECT_LE(p->vae_keep_bytes, 256 * kMiB);
  }
  auto a = plan_memory(synthetic(), 2 * kGiB), b = plan_memory(synthetic(), 1536 * kMiB + 600 * kMiB);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GE(b->vae_tile, a->vae_tile);  // more budget, tiles no smaller
}

TEST(MemoryPlan, ForcedTileIsKept) {
  MemoryNeeds n = synthetic();
  n.vae_forced_tile = 256;
  auto p = plan_memory(n, 16 * kGiB);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->vae_tile, 256);
  n.vae_forced_tile = -1;  // never tile: a budget below the whole-image decode cannot be met
  auto q = plan_memory(n, 2 * kGiB);
  EXPECT_EQ(q.status().code(), klein::Code::kOutOfMemory);
}

TEST(MemoryPlan, TooSmallSaysWhatItNeeds) {
  auto p = plan_memory(synthetic(), kGiB);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), klein::Code::kOutOfMemory);
  const std::string m = p.status().message();
  EXPECT_NE(m.find("--max-memory 1.00: this request needs at least 1."), std::string::npos) << m;
  EXPECT_NE(m.find("denoise"), std::string::npos) << m;  // the transformer phase is the tightest
  EXPECT_EQ(m.find('\n'), std::string::npos);
}

// A prompt encoded on its own (Model::encode_prompt) needs only the text encoder's phase: 1 GiB
// is far below the transformer's streamed phase but enough for the encoder streamed.
TEST(MemoryPlan, EncodeOnlyCountsTheTextEncoder) {
  MemoryNeeds n = synthetic();
  n.encode_only = true;
  auto p = plan_memory(n, kGiB);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE(p->stream_te);
  EXPECT_LE(p->peak(), kGiB);
  EXPECT_EQ(p->denoise + p->decode, 0u);
  EXPECT_EQ(p->summary().find("transformer"), std::string::npos) << p->summary();
  auto whole = plan_memory(n, 6 * kGiB);  // 5 GiB of weights + activations fit: not streamed
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_FALSE(whole->stream_te);
  auto small = plan_memory(n, 300 * kMiB);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), klein::Code::kOutOfMemory);
  EXPECT_NE(small.status().message().find("(encode: text encoder weights"), std::string::npos)
      << small.status().message();
}

TEST(MemoryPlan, ScratchBoundGrowsWithShapes) {
  klein::kernels::ScratchShape s;
  s.max_k = 12288;
  const uint64_t plain = klein::kernels::scratch_bytes_per_thread(s);
  // Whatever the format: the AMX GEMMs' aligned copy of a 128-row bf16 slab (gemm_amx.cpp).
  EXPECT_GE(plain, uint64_t{128} * 12288 * 2);
  s.converts_weights = true;
  EXPECT_GT(klein::kernels::scratch_bytes_per_thread(s), plain + 256 * 12288 * 4);
  s.conv_cin = 512;
  s.conv_width = 1024;
  EXPECT_GT(klein::kernels::scratch_bytes_per_thread(s), 512u * 6 * 1024 * 4);
  // The calling thread's copies of x come on top of the threads' share, once.
  const uint64_t two = klein::kernels::scratch_bound_bytes(s, 2);
  EXPECT_EQ(two, 2 * klein::kernels::scratch_bytes_per_thread(s) + klein::kernels::activation_copy_bytes(s));
  s.max_x = 4608 * 3072;  // the DiT's projections at 1024²
  EXPECT_GE(klein::kernels::scratch_bound_bytes(s, 2), two + 6 * uint64_t{4608} * 3072);
}

TEST(MemoryBudget, TooSmallFailsBeforeAnyWork) {
  klein::LoadOptions lo;
  lo.threads = 2;
  lo.max_memory_gib = 0.001;
  auto m = klein::Model::open(tiny(), lo);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  int events = 0;
  klein::Callbacks cb;
  cb.progress = [&](const std::string&, int, int) { ++events; };
  auto r = (*m)->generate(small_request(), cb);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), klein::Code::kOutOfMemory);
  EXPECT_NE(r.status().message().find("--max-memory 0.00: this request needs at least "), std::string::npos)
      << r.status().message();
  EXPECT_EQ(events, 0);  // not even tokenized
}

TEST(MemoryBudget, StreamedRunGivesTheSameImage) {
  klein::LoadOptions lo;
  lo.threads = 2;
  auto plain = klein::Model::open(tiny(), lo);
  ASSERT_TRUE(plain.ok());
  auto a = (*plain)->generate(small_request());
  ASSERT_TRUE(a.ok()) << a.status().to_string();

  for (auto policy : {klein::MemoryPolicy::kLow, klein::MemoryPolicy::kResident}) {
    lo.memory = policy;
    int planned = 0;
    auto b = generate_streamed(tiny(), lo, &planned);
    ASSERT_TRUE(b.result.ok()) << b.result.status().to_string();
    EXPECT_EQ(planned, 1);
    EXPECT_NE(b.plan_line.find("text encoder streamed, transformer streamed, VAE whole image"), std::string::npos)
        << b.plan_line;
    EXPECT_EQ(png_of(a->image), png_of(b.result->image));  // byte-identical PNG
  }
}

// The same with q8 / q4 folders in both precisions: the text encoder's gate and up then load as
// one stacked weight (adjacent in klein quantize's files), which streaming must load and
// release like any other.
TEST(MemoryBudget, StreamedQuantizedRunGivesTheSameImage) {
  const auto dir = klein::testing::make_temp_dir("mem_quant");
  for (const char* type : {"q8", "q4"}) {
    klein::QuantizeOptions q;
    q.model = tiny();
    q.output = (dir / type).string();
    q.type = type;
    ASSERT_TRUE(klein::quantize_model(q).ok());
    for (auto precision : {klein::Precision::kFp32, klein::Precision::kFast}) {
      klein::LoadOptions lo;
      lo.threads = 2;
      lo.precision = precision;
      auto plain = klein::Model::open(q.output, lo);
      ASSERT_TRUE(plain.ok());
      auto a = (*plain)->generate(small_request());
      ASSERT_TRUE(a.ok()) << a.status().to_string();
      auto b = generate_streamed(q.output, lo);
      ASSERT_TRUE(b.result.ok()) << type << ": " << b.result.status().to_string();
      EXPECT_NE(b.plan_line.find("text encoder streamed, transformer streamed"), std::string::npos) << b.plan_line;
      EXPECT_EQ(png_of(a->image), png_of(b.result->image)) << type << " precision " << static_cast<int>(precision);
    }
  }
}

TEST(MemoryBudget, DontNeedReleasesMappedPages) {
  const fs::path f = klein::testing::make_temp_dir("memory") / "madvise.bin";
  const size_t n = size_t{64} << 20;
  {
    std::ofstream o(f, std::ios::binary);
    std::vector<char> chunk(1 << 20, 1);
    for (size_t i = 0; i < n; i += chunk.size()) o.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
  }
  auto m = klein::MappedFile::open(f);
  ASSERT_TRUE(m.ok());
  const uint64_t before = klein::api::process_rss_bytes();
  volatile uint64_t sum = 0;
  for (size_t i = 0; i < n; i += 4096) sum = sum + (*m)->data()[i];
  const uint64_t touched = klein::api::process_rss_bytes();
  EXPECT_GT(touched, before + (n * 3 / 4));
  EXPECT_TRUE((*m)->advise((*m)->data(), n, klein::Residency::kDontNeed));
  EXPECT_LT(klein::api::process_rss_bytes(), touched - (n * 3 / 4));
  const uint64_t elsewhere = 0;
  EXPECT_FALSE((*m)->advise(&elsewhere, 8, klein::Residency::kDontNeed));  // not in the mapping: left alone
  for (size_t i = 0; i < n; i += 4096) sum = sum + (*m)->data()[i];  // refaults the same bytes
  EXPECT_EQ(sum, 2 * (n / 4096));
}

// host_alloc_bytes: 64-byte alignment always; large buffers 2 MiB aligned and, where the kernel
// offers transparent huge pages, advised for them (the VMA's VmFlags then carry "hg").
namespace {
bool vma_has_flag(const void* p, const std::string& flag) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    // A mapping's first line is "lo-hi perms ..."; its attribute lines start with a name.
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {
      inside = addr >= lo && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return (line + " ").find(" " + flag + " ") != std::string::npos;
    }
  }
  return false;
}
}  // namespace

TEST(HostMemory, AlignmentAndHugePageAdvice) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{100}, klein::kHugePageBytes - 1}) {
    void* p = klein::host_alloc_bytes(n);
    ASSERT_NE(p, nullptr) << n;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << n;
    std::memset(p, 1, n);
    std::free(p);
  }
  const char* env = std::getenv("KLEIN_HUGEPAGES");
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(thp, mode);
  const bool offered = (mode.find("[madvise]") != std::string::npos || mode.find("[always]") != std::string::npos) &&
                       !(env && std::string(env) == "0");
  for (size_t n : {klein::kHugePageBytes, 5 * klein::kHugePageBytes + 3}) {
    void* p = klein::host_alloc_bytes(n);
    ASSERT_NE(p, nullptr) << n;
    if (env && std::string(env) == "0") {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    } else {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % klein::kHugePageBytes, 0u) << n;
      if (offered) EXPECT_TRUE(vma_has_flag(p, "hg")) << "no MADV_HUGEPAGE on a " << n << "-byte buffer";
    }
    std::memset(p, 1, n);
    std::free(p);
  }
}

// Tensors are zero-initialised and 64-byte aligned, and a large one becomes resident only as it
// is written (core/tensor.cpp: calloc, no clearing pass over fresh pages), so a scratch the
// kernels never write — the fused SwiGLU's [rows, 2F] — costs no RSS. A reused block is still
// zero: the heap's own memory, written and freed, comes back cleared.
TEST(HostMemory, TensorPagesBecomeResidentOnlyWhenWritten) {
  if (klein::testing::kAddressSanitizer) GTEST_SKIP() << "ASan's allocator and shadow memory change what RSS counts";
  if (klein::testing::kThreadSanitizer) GTEST_SKIP() << "TSan's allocator clears the memory it hands out";
  const int64_t n = int64_t{64} << 20;  // 256 MiB of floats
  const uint64_t before = klein::api::process_rss_bytes();
  auto t = klein::Tensor::alloc({n}, "a test tensor");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % 64, 0u);
  const uint64_t allocated = klein::api::process_rss_bytes();
  EXPECT_LT(allocated, before + (uint64_t{16} << 20)) << "a fresh tensor's pages were touched";
  float* d = t->data();
  for (int64_t i = 0; i < n / 2; i += 1024) d[i] = 1.0f;  // the first half, one write per 4 KiB page
  const uint64_t half = klein::api::process_rss_bytes();
  EXPECT_GT(half, allocated + uint64_t(n) * 4 / 2 * 3 / 4);
  EXPECT_LT(half, allocated + uint64_t(n) * 4 / 2 + (uint64_t{16} << 20));
  for (int64_t i = n / 2; i < n; i += 4093) ASSERT_EQ(d[i], 0.0f) << i;  // never written: still zero

  for (int64_t size : {int64_t{3}, int64_t{1000}, int64_t{300000}}) {  // heap-sized blocks, reused
    for (int round = 0; round < 3; ++round) {
      klein::Tensor s({size});
      ASSERT_EQ(reinterpret_cast<uintptr_t>(s.data()) % 64, 0u) << size;
      for (int64_t i = 0; i < size; ++i) ASSERT_EQ(s.data()[i], 0.0f) << size << " round " << round << " at " << i;
      std::fill(s.data(), s.data() + size, 7.0f);
    }
  }
}

// Model::estimate_memory: the planner's figures for a request shape, before any work. The
// smallest budget it names runs the request; a budget well below it is refused before any work.
TEST(MemoryEstimate, SmallestBudgetRunsAndLessIsRefused) {
  klein::LoadOptions lo;
  lo.threads = 2;
  auto probe = klein::Model::open(tiny(), lo);
  ASSERT_TRUE(probe.ok()) << probe.status().to_string();
  klein::RequestSize rs;
  rs.width = small_request().width;
  rs.height = small_request().height;
  auto e = (*probe)->estimate_memory(rs);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ(e->width, 48);
  EXPECT_EQ(e->height, 32);
  EXPECT_EQ(e->image_tokens, 3 * 2);
  EXPECT_EQ(e->reference_tokens, 0);
  EXPECT_FALSE(e->guidance);
  EXPECT_GT(e->minimum_bytes, 0u);
  EXPECT_LE(e->minimum_bytes, e->resident_bytes);
  EXPECT_NE(e->resident_plan.find("transformer whole"), std::string::npos) << e->resident_plan;
  if (klein::testing::kAddressSanitizer || klein::testing::kThreadSanitizer)
    GTEST_SKIP() << "the runs below compare budgets with RSS, which a sanitizer's allocator changes";
  probe->reset();
  const double margin = 64.0 / 1024;  // GiB: the process changes a little between the calls
  lo.max_memory_gib = static_cast<double>(e->minimum_bytes) / (1ull << 30) + margin;
  auto ok = klein::Model::open(tiny(), lo);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  auto r = (*ok)->generate(small_request());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  ok->reset();
  lo.max_memory_gib = static_cast<double>(e->minimum_bytes) / (1ull << 30) - margin;
  auto low = klein::Model::open(tiny(), lo);
  ASSERT_TRUE(low.ok()) << low.status().to_string();
  r = (*low)->generate(small_request());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), klein::Code::kOutOfMemory) << r.status().to_string();
}

// References, guidance and the default size count as generate counts them; bad shapes are errors.
TEST(MemoryEstimate, ReferencesGuidanceAndDefaults) {
  auto m = klein::Model::open(tiny());
  ASSERT_TRUE(m.ok());
  klein::RequestSize rs;
  auto plain = (*m)->estimate_memory(rs);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->width, 1024);  // the tiny model's VAE says sample_size 1024, as the real ones
  EXPECT_EQ(plain->image_tokens, 64 * 64);
  rs.references = {{512, 256}, {64, 64}};
  auto edit = (*m)->estimate_memory(rs);
  ASSERT_TRUE(edit.ok()) << edit.status().to_string();
  EXPECT_EQ(edit->width, 512);  // the first reference's size
  EXPECT_EQ(edit->height, 256);
  EXPECT_EQ(edit->reference_tokens, 32 * 16 + 4 * 4);
  rs.references = {{0, 10}};
  EXPECT_FALSE((*m)->estimate_memory(rs).ok());
  rs.references.clear();
  rs.inpaint = true;
  auto bad = (*m)->estimate_memory(rs);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("source"), std::string::npos) << bad.status().to_string();

  auto base = klein::Model::open((klein::testing::data_dir() / "tiny_base").string());
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  klein::RequestSize b;
  b.width = b.height = 64;
  b.guidance_scale = 1.0;
  auto plain_base = (*base)->estimate_memory(b);
  ASSERT_TRUE(plain_base.ok());
  EXPECT_FALSE(plain_base->guidance);
  b.guidance_scale = -1;  // the base model's default, 4.0
  auto cfg = (*base)->estimate_memory(b);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_TRUE(cfg->guidance);
  // CFG never needs less. Each figure includes the process's RSS at its call, which moves a little
  // between calls (more under ASan, whose allocator keeps freed memory): a slack for that.
  EXPECT_GE(cfg->resident_bytes + (32u << 20), plain_base->resident_bytes);
}
