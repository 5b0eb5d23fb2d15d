// TensorSource decorators that let a model bind the files users hold (BFL / ComfyUI single files,
// all-in-one checkpoints) under the diffusers names it asks for:
//   ScopedSource — the tensors under one prefix of a checkpoint, prefix removed
//                  (ComfyUI's "model.diffusion_model.", "vae.", "text_encoders.qwen3_4b.transformer.");
//   MappedSource — a source seen through a NameMap (io/name_map.h): renames, fused-row splits
//                  (views), half swaps (an owned copy) and 1×1-conv ↔ linear reshapes.
// Both keep the source they wrap alive and pass its advise() hints through.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/name_map.h"
#include "io/tensor_source.h"

namespace klein {

class ScopedSource final : public TensorSource {
 public:
  // Fails when no tensor of `src` starts with `prefix`.
  static Result<std::shared_ptr<ScopedSource>> create(std::shared_ptr<const TensorSource> src, std::string prefix);

  bool has(const std::string& name) const override;
  Result<Weight> get(const std::string& name) const override;
  std::vector<std::string> names() const override { return names_; }
  std::string file_of(const std::string& name) const override { return src_->file_of(prefix_ + name); }
  const std::string& origin() const override { return origin_; }
  size_t total_bytes() const override { return bytes_; }
  void advise(const void* p, size_t n, Residency r) const override { src_->advise(p, n, r); }

  ScopedSource(std::shared_ptr<const TensorSource> src, std::string prefix, std::vector<std::string> names,
               size_t bytes);

 private:
  std::shared_ptr<const TensorSource> src_;
  std::string prefix_;
  std::string origin_;
  std::vector<std::string> names_;  // sorted, prefix removed
  size_t bytes_ = 0;
};

class MappedSource final : public TensorSource {
 public:
  // Maps every name of `src` (map_names): an unmatched or clashing tensor is an error naming
  // it. Shapes are checked when a tensor is asked for.
  static Result<std::shared_ptr<MappedSource>> create(std::shared_ptr<const TensorSource> src, NameMap map);

  bool has(const std::string& name) const override { return targets_.count(name) != 0; }
  // kSwapHalves and kOhwiToOihw return a copy the Weight owns; it is made on every call (the
  // models ask once).
  Result<Weight> get(const std::string& name) const override;
  std::vector<std::string> names() const override;
  // The file and the stored tensor a name comes from: "ae.safetensors (as 'mid.attn_1.q.weight')".
  std::string file_of(const std::string& name) const override;
  // "<the source's origin> via name map <name>": a missing diffusers name is then read against
  // the map that should have produced it.
  const std::string& origin() const override { return origin_; }
  size_t total_bytes() const override { return src_->total_bytes(); }
  void advise(const void* p, size_t n, Residency r) const override { src_->advise(p, n, r); }

  const NameMap& map() const { return map_; }

  MappedSource(std::shared_ptr<const TensorSource> src, NameMap map,
               std::vector<std::pair<std::string, MappedName>> mapped);

 private:
  struct Target {
    std::string source;
    MappedName mapped;
  };
  std::shared_ptr<const TensorSource> src_;
  NameMap map_;
  std::string origin_;
  std::map<std::string, Target> targets_;
};

// Names and shapes of a source's tensors (for detection). A tensor the source cannot give (a
// quantized weight missing a companion) is an error.
Result<std::vector<TensorInfo>> tensor_infos(const TensorSource& src);

}  // namespace klein
