#include "pipeline/quantize_model.h"

#include <algorithm>
#include <cstdio>
#include <fnmatch.h>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sys/mman.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/format.h"
#include "core/quantize.h"
#include "core/thread_pool.h"
#include "core/weight.h"
#include "io/json_file.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace klein {
namespace {

enum class QType { kQ8, kQ4, kBf16 };
enum class Action { kCopy, kQ8, kQ4, kBf16 };

// The components `quantize` rewrites; the VAE (convolutions, small) is copied as stored.
constexpr const char* kQuantizable[] = {"text_encoder", "transformer"};

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

bool glob_match(const std::string& glob, const std::string& name) {
  return fnmatch(glob.c_str(), name.c_str(), 0) == 0;
}

// An output tensor: its header entry and how its bytes are made.
struct OutTensor {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t nbytes;
};

struct Plan {
  std::string name;  // input tensor
  Action action;
  std::vector<OutTensor> out;
  std::vector<uint64_t> at;  // each out tensor's offset in the file's data section (layout_file)
};

Action decide(const std::string& name, const TensorEntry& e, QType type, const std::vector<std::string>& globs,
              std::vector<std::string>* kept) {
  // Only 2-D float Linear weights are quantized; 1-D tensors (norms, biases) and integer buffers
  // are copied as stored.
  if (!is_float(e.dtype) || e.shape.size() != 2 || !name.ends_with(".weight")) return Action::kCopy;
  for (const std::string& g : globs)
    if (glob_match(g, name)) {
      kept->push_back(name);
      return Action::kCopy;
    }
  switch (type) {
    case QType::kQ8: return Action::kQ8;
    case QType::kQ4:
      // Group 64 along the input dimension: a weight with fewer or ragged columns stays as stored.
      if (e.shape[1] % 64 != 0) {
        kept->push_back(name);
        return Action::kCopy;
      }
      return Action::kQ4;
    case QType::kBf16: return e.dtype == DType::kBF16 ? Action::kCopy : Action::kBf16;
  }
  return Action::kCopy;
}

Plan plan_tensor(const std::string& name, const TensorEntry& e, Action a) {
  Plan p{name, a, {}, {}};
  const int64_t rows = e.shape.empty() ? 0 : e.shape[0], cols = e.shape.size() == 2 ? e.shape[1] : 0;
  const uint64_t n = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  switch (a) {
    case Action::kCopy: p.out.push_back({name, e.dtype, e.shape, e.nbytes}); break;
    case Action::kBf16: p.out.push_back({name, DType::kBF16, e.shape, 2 * n}); break;
    case Action::kQ8:
      p.out.push_back({name, DType::kI8, e.shape, n});
      p.out.push_back({name + "_scale", DType::kF32, {rows}, 4 * static_cast<uint64_t>(rows)});
      break;
    case Action::kQ4: {
      const std::string base = name.substr(0, name.size() - 6);  // "a.b.weight" → "a.b."
      const Shape gs{rows, cols / 64};
      p.out.push_back({name, DType::kU32, {rows, cols / 8}, n / 2});
      p.out.push_back({base + "scales", DType::kBF16, gs, n / 32});
      p.out.push_back({base + "biases", DType::kBF16, gs, n / 32});
      break;
    }
  }
  return p;
}

// Drops the input pages of a tensor once written: the mapping is read-only and file-backed, so
// the pages are re-read if touched again; without this the whole model ends up resident.
void release_pages(const void* p, size_t n) {
  static const uintptr_t kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t a = reinterpret_cast<uintptr_t>(p), b = a + n;
  a = (a + kPage - 1) & ~(kPage - 1);
  b &= ~(kPage - 1);
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

class FileWriter {
 public:
  explicit FileWriter(fs::path p) : path_(std::move(p)), f_(std::fopen(path_.c_str(), "wb")) {}
  ~FileWriter() {
    if (f_) std::fclose(f_);
  }
  bool ok() const { return f_ != nullptr && ok_; }
  void write(const void* d, size_t n) {
    if (ok() && n && std::fwrite(d, 1, n, f_) != n) ok_ = false;
    pos_ += n;
  }
  // Writes at byte `pos` of the file (a seek unless it is where the last write ended).
  void write_at(uint64_t pos, const void* d, size_t n) {
    if (ok() && pos != pos_ && fseeko(f_, static_cast<off_t>(pos), SEEK_SET) != 0) ok_ = false;
    pos_ = pos;
    write(d, n);
  }
  Status close() {
    const bool good = ok() && std::fflush(f_) == 0 && fsync(fileno(f_)) == 0;
    const bool closed = f_ && std::fclose(f_) == 0;
    f_ = nullptr;
    return good && closed ? Status::Ok() : io_error(path_.string() + ": write failed (disk full?)");
  }

 private:
  fs::path path_;
  std::FILE* f_;
  bool ok_ = true;
  uint64_t pos_ = 0;
};

// Produces the bytes of one planned tensor and writes them at base + p.at[i] (base: where the
// file's data section starts).
Status write_tensor(const WeightStore& store, const Plan& p, uint64_t base, FileWriter& out, ThreadPool& pool) {
  const TensorEntry* e = store.entry(p.name);
  if (p.action == Action::kCopy) {
    // In 64 MiB pieces, each released once written: a kept embedding table (778 MB in Qwen3-4B)
    // would otherwise be resident whole.
    constexpr size_t kPiece = size_t{64} << 20;
    for (size_t off = 0; off < e->nbytes; off += kPiece) {
      const size_t n = std::min(kPiece, e->nbytes - off);
      out.write_at(base + p.at[0] + off, e->data + off, n);
      release_pages(e->data + off, n);
    }
    return Status::Ok();
  }
  KLEIN_ASSIGN_OR_RETURN(Weight w, store.get(p.name));
  const int64_t rows = e->shape[0], cols = e->shape[1];
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  auto each_row = [&](const std::function<void(int64_t, const float*)>& fn) {
    pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = r0; r < r1; ++r) {
        weight_row_to_f32(w, r, row.data());
        fn(r, row.data());
      }
    }, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, cols / 1024)));
  };
  switch (p.action) {
    case Action::kBf16: {
      std::vector<uint16_t> b(n);
      each_row([&](int64_t r, const float* x) {
        for (int64_t k = 0; k < cols; ++k) b[r * cols + k] = f32_to_bf16(x[k]);
      });
      out.write_at(base + p.at[0], b.data(), 2 * n);
      break;
    }
    case Action::kQ8: {
      std::vector<int8_t> q(n);
      std::vector<float> s(static_cast<size_t>(rows));
      each_row([&](int64_t r, const float* x) { s[r] = quantize_row_q8(x, cols, q.data() + r * cols); });
      out.write_at(base + p.at[0], q.data(), n);
      out.write_at(base + p.at[1], s.data(), 4 * s.size());
      break;
    }
    case Action::kQ4: {
      const int64_t groups = cols / 64;
      std::vector<uint8_t> q(n / 2);
      std::vector<uint16_t> s(static_cast<size_t>(rows * groups)), b(s.size());
      each_row([&](int64_t r, const float* x) {
        for (int64_t g = 0; g < groups; ++g) {
          float sc, bi;
          quantize_group_q4(x + g * 64, q.data() + r * (cols / 2) + g * 32, &sc, &bi);
          s[r * groups + g] = f32_to_bf16(sc);
          b[r * groups + g] = f32_to_bf16(bi);
        }
      });
      out.write_at(base + p.at[0], q.data(), q.size());
      out.write_at(base + p.at[1], s.data(), 2 * s.size());
      out.write_at(base + p.at[2], b.data(), 2 * b.size());
      break;
    }
    case Action::kCopy: break;
  }
  return Status::Ok();
}

// Places the plans' output tensors in the file: every plan's first tensor (the weight itself) in
// input order, then the q8 scales / q4 scales, then the q4 biases. So the weights of a layer's
// gate and up projections, adjacent in a name-ordered input, stay adjacent in the output, and
// so do their scales and biases: the text encoder then reads the two as one matrix
// (Weight::stacked_with), with no copy.
void layout_file(std::vector<Plan>& plans) {
  uint64_t off = 0;
  size_t kinds = 0;  // most output tensors of one plan
  for (Plan& p : plans) {
    p.at.assign(p.out.size(), 0);
    kinds = std::max(kinds, p.out.size());
  }
  for (size_t j = 0; j < kinds; ++j)
    for (Plan& p : plans)
      if (j < p.out.size()) {
        p.at[j] = off;
        off += p.out[j].nbytes;
      }
}

std::string header_of(const std::vector<Plan>& plans) {
  std::vector<std::pair<uint64_t, const OutTensor*>> entries;
  for (const Plan& p : plans)
    for (size_t j = 0; j < p.out.size(); ++j) entries.emplace_back(p.at[j], &p.out[j]);
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  json h = json::object();
  for (const auto& [off, t] : entries)
    h[t->name] = {{"dtype", std::string(dtype_name(t->dtype))}, {"shape", t->shape}, {"data_offsets", {off, off + t->nbytes}}};
  std::string s = h.dump();
  pad_safetensors_header(s);
  return s;
}

Status write_text(const fs::path& p, const std::string& text) {
  FileWriter f(p);
  f.write(text.data(), text.size());
  return f.close();
}

struct Context {
  const QuantizeSpec& spec;
  QType type;
  std::vector<std::string> globs;  // default + --keep
  ThreadPool pool;
};

// Rewrites one component's safetensors files (same file names, so a sharded index stays
// valid after its weight_map is rewritten) and its config.json.
Status quantize_component(Context& cx, const std::string& cname, const fs::path& in, const fs::path& out) {
  KLEIN_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open(in));
  std::map<int, std::vector<std::string>> by_file;
  for (const std::string& n : store.names()) by_file[store.entry(n)->file_index].push_back(n);
  std::vector<std::string> kept;
  json weight_map = json::object();
  uint64_t total = 0;
  int done = 0;
  const int count = static_cast<int>(store.names().size());
  for (auto& [fi, names] : by_file) {
    // File order, so the input is read sequentially.
    std::sort(names.begin(), names.end(),
              [&](const std::string& a, const std::string& b) { return store.entry(a)->data < store.entry(b)->data; });
    std::vector<Plan> plans;
    for (const std::string& n : names) {
      const TensorEntry& e = *store.entry(n);
      plans.push_back(plan_tensor(n, e, decide(n, e, cx.type, cx.globs, &kept)));
    }
    const std::string fname = fs::path(store.files()[fi]).filename().string();
    layout_file(plans);
    const std::string header = header_of(plans);
    FileWriter w(out / fname);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
    w.write(len, 8);
    w.write(header.data(), header.size());
    for (const Plan& p : plans) {
      if (cx.spec.cancel && cx.spec.cancel()) return cancelled("quantize: cancelled");
      KLEIN_RETURN_IF_ERROR(write_tensor(store, p, 8 + header.size(), w, cx.pool));
      if (!w.ok()) return io_error((out / fname).string() + ": write failed at tensor '" + p.name + "' (disk full?)");
      const TensorEntry* e = store.entry(p.name);
      release_pages(e->data, e->nbytes);
      for (const OutTensor& t : p.out) {
        weight_map[t.name] = fname;
        total += t.nbytes;
      }
      if (cx.spec.progress) cx.spec.progress("quantize " + cname, ++done, count);
    }
    KLEIN_RETURN_IF_ERROR(w.close());
  }
  // A sharded input keeps its index, with the companions added to the weight map.
  for (const auto& de : fs::directory_iterator(in))
    if (de.path().filename().string().ends_with(".safetensors.index.json")) {
      KLEIN_ASSIGN_OR_RETURN(auto idx, read_json_file(de.path()));
      json j = json::object();
      j["metadata"] = idx.contains("metadata") && idx["metadata"].is_object() ? json(idx["metadata"]) : json::object();
      j["metadata"]["total_size"] = total;
      j["weight_map"] = weight_map;
      KLEIN_RETURN_IF_ERROR(write_text(out / de.path().filename(), j.dump(2) + "\n"));
    }
  // The scheme goes into config.json, so `klein info` and converters can tell what was done.
  KLEIN_ASSIGN_OR_RETURN(auto cfg_in, read_json_file(in / "config.json"));
  json cfg = json::parse(cfg_in.dump());
  json q = {{"type", cx.spec.type}};
  if (cx.type == QType::kQ4) {
    q["group_size"] = 64;
    q["bits"] = 4;
    q["mode"] = "affine (MLX)";
  }
  if (cx.type == QType::kQ8) q["mode"] = "int8 symmetric per output row, f32 scale";
  q["kept"] = kept;
  cfg["quantization"] = q;
  KLEIN_RETURN_IF_ERROR(write_text(out / "config.json", cfg.dump(2) + "\n"));
  if (cx.spec.log)
    cx.spec.log(cname + ": " + std::to_string(count) + " tensors, " + std::to_string(kept.size()) +
                " 2-D weights kept as stored, " + std::to_string(total) + " bytes");
  return Status::Ok();
}

// `p` without "." / ".." parts or a trailing separator: the folder the paths below it start with.
fs::path folder_base(const fs::path& p) {
  fs::path b = p.lexically_normal();
  return b.has_filename() ? b : b.parent_path();
}

bool is_weight_file(const fs::path& p) {
  const std::string f = p.filename().string();
  return f.ends_with(".safetensors") || f.ends_with(".safetensors.index.json") || f == "config.json";
}

// Copies `in` to `out` recursively (symbolic links followed: a Hugging Face snapshot is links into
// its blob store), leaving out the weight files and config of the quantized components.
Status copy_tree(const fs::path& in, const fs::path& out, const std::vector<fs::path>& rewritten) {
  std::error_code ec;
  const fs::path base = folder_base(in);
  for (auto it = fs::recursive_directory_iterator(in, fs::directory_options::follow_directory_symlink, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    // Lexically: fs::relative resolves links, and a linked file's target (a blob store) is not
    // under `in`, which would put its copy outside `out`.
    const fs::path rel = it->path().lexically_relative(base);
    if (rel.empty() || *rel.begin() == "..") return internal_error(it->path().string() + ": not under " + in.string());
    const fs::path dst = out / rel;
    if (it->is_directory(ec)) {
      fs::create_directories(dst, ec);
    } else {
      const fs::path parent = it->path().parent_path();
      if (is_weight_file(it->path()) &&
          std::find(rewritten.begin(), rewritten.end(), parent) != rewritten.end())
        continue;
      fs::copy_file(it->path(), dst, fs::copy_options::overwrite_existing, ec);
      if (ec) return io_error(dst.string() + ": cannot copy from " + it->path().string() + " (" + ec.message() + ")");
    }
    if (ec) break;
  }
  if (ec) return io_error(in.string() + ": cannot copy the folder (" + ec.message() + ")");
  return Status::Ok();
}

Status check_spec(const QuantizeSpec& s, QType* type) {
  if (s.type == "q8") *type = QType::kQ8;
  else if (s.type == "q4") *type = QType::kQ4;
  else if (s.type == "bf16") *type = QType::kBf16;
  else return invalid_argument("--type '" + s.type + "': expected q8, q4 or bf16");
  for (const std::string& g : s.keep) {
    const size_t open = g.find('['), close = g.find(']', open == std::string::npos ? 0 : open);
    if (g.empty() || (open != std::string::npos && close == std::string::npos))
      return invalid_argument("--keep '" + g + "': not a tensor-name glob (e.g. 'transformer_blocks.0.*')");
  }
  if (s.output.empty()) return invalid_argument("quantize: give an output folder (-o)");
  std::error_code ec;
  // Absolute first: weakly_canonical leaves a relative path none of whose parts exist ("OUT")
  // relative, whose parent_path() is then "" rather than the working folder.
  fs::path in = fs::weakly_canonical(fs::absolute(s.input, ec), ec);
  fs::path out = fs::weakly_canonical(fs::absolute(s.output, ec), ec);
  if (!in.has_filename()) in = in.parent_path();  // trailing separators
  if (!out.has_filename()) out = out.parent_path();
  if (in == out) return invalid_argument("-o " + s.output.string() + ": is the input folder; write to a new folder");
  const auto [mi, mo] = std::mismatch(in.begin(), in.end(), out.begin(), out.end());
  if (mi == in.end()) return invalid_argument("-o " + s.output.string() + ": is inside the input folder " + s.input.string());
  if (fs::exists(s.output, ec)) return invalid_argument("-o " + s.output.string() + ": already exists; remove it or choose a new folder");
  if (!fs::is_directory(out.parent_path(), ec))
    return not_found("-o " + s.output.string() + ": its parent folder does not exist");
  return Status::Ok();
}

}  // namespace

Status check_quantize_spec(const QuantizeSpec& spec) {
  QType type;
  return check_spec(spec, &type);
}

const std::vector<std::string>& default_keep_globs() {
  static const std::vector<std::string> k = {
      "*embed_tokens*", "lm_head.*",     "time_guidance_embed.*", "*modulation*", "norm_out.*",
      "x_embedder.*",   "context_embedder.*", "proj_out.*",      "*norm*",
  };
  return k;
}

Status quantize_model_folder(const QuantizeSpec& spec) {
  QType type;
  KLEIN_RETURN_IF_ERROR(check_spec(spec, &type));
  KLEIN_ASSIGN_OR_RETURN(ModelFolder folder, ModelFolder::open(spec.input));
  std::vector<std::pair<std::string, fs::path>> comps;
  for (const char* c : kQuantizable)
    if (folder.has(c)) {
      KLEIN_ASSIGN_OR_RETURN(ComponentInfo ci, folder.component(c));
      comps.emplace_back(c, ci.dir);
    }
  if (comps.empty()) return not_found(spec.input.string() + ": no text_encoder or transformer to quantize");
  // Integer weights are copied as stored (decide), so a q8 / q4 input would come out unchanged
  // under a config that names the new scheme; re-quantizing their dequantized values would round
  // twice. Either way the user wants the full-precision folder.
  for (const auto& [name, dir] : comps) {
    KLEIN_ASSIGN_OR_RETURN(WeightStore st, WeightStore::open(dir));
    for (const std::string& n : st.names()) {
      const TensorEntry* e = st.entry(n);
      if (e->shape.size() == 2 && n.ends_with(".weight") && !is_float(e->dtype))
        return unsupported("--model " + spec.input.string() + ": " + name + " is already quantized (tensor '" + n +
                           "' is " + std::string(dtype_name(e->dtype)) +
                           "); quantize from the full-precision folder");
    }
  }
  // A --keep glob that matches nothing is a typo, not a no-op.
  for (const std::string& g : spec.keep) {
    bool hit = false;
    for (const auto& [name, dir] : comps) {
      KLEIN_ASSIGN_OR_RETURN(WeightStore st, WeightStore::open(dir));
      for (const std::string& n : st.names()) hit = hit || glob_match(g, n);
    }
    if (!hit) return invalid_argument("--keep '" + g + "': matches no tensor of the text encoder or transformer");
  }
  Context cx{spec, type, default_keep_globs(), ThreadPool(spec.threads)};
  cx.globs.insert(cx.globs.end(), spec.keep.begin(), spec.keep.end());

  std::random_device rd;
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, ".tmp-%d-%08x", static_cast<int>(getpid()), rd());
  fs::path output = spec.output;
  if (!output.has_filename()) output = output.parent_path();  // "OUT/" names OUT
  const fs::path tmp = output.string() + suffix;
  std::error_code ec;
  if (!fs::create_directory(tmp, ec)) return io_error(tmp.string() + ": cannot create (" + ec.message() + ")");
  auto run = [&]() -> Status {
    std::vector<fs::path> rewritten;
    for (const auto& c : comps) rewritten.push_back(c.second);
    KLEIN_RETURN_IF_ERROR(copy_tree(spec.input, tmp, rewritten));
    for (const auto& [name, dir] : comps) {
      const fs::path out = tmp / dir.lexically_normal().lexically_relative(folder_base(spec.input));
      fs::create_directories(out);
      KLEIN_RETURN_IF_ERROR(quantize_component(cx, name, dir, out));
    }
    if (spec.finish) KLEIN_RETURN_IF_ERROR(spec.finish(tmp));
    fs::rename(tmp, output, ec);
    if (ec) return io_error(output.string() + ": cannot rename " + tmp.string() + " (" + ec.message() + ")");
    return Status::Ok();
  };
  Status st;
  try {
    st = run();
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  if (!st.ok()) fs::remove_all(tmp, ec);
  return st;
}

}  // namespace klein
