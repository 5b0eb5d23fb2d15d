// The input as model_index.json of a folder that holds the tiny model's component configs
// (copied once), opened as Model::open starts: the component table, then each listed
// component's folder and config.
#include <cstdint>
#include <filesystem>

#include "fuzz_util.h"
#include "io/model_folder.h"

namespace fs = std::filesystem;

namespace {

const fuzz::Scratch& folder() {
  static const fuzz::Scratch scratch("model-index");
  static const bool copied = [] {
    const fs::path tiny = fs::path(KLEIN_SOURCE_DIR) / "tests/data/tiny";
    for (const char* f : {"text_encoder/config.json", "transformer/config.json", "vae/config.json",
                          "scheduler/scheduler_config.json", "tokenizer/tokenizer_config.json"}) {
      fs::create_directories((scratch.dir() / f).parent_path());
      fs::copy_file(tiny / f, scratch.dir() / f, fs::copy_options::overwrite_existing);
    }
    return true;
  }();
  (void)copied;
  return scratch;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fuzz::Scratch& scratch = folder();
  scratch.write("model_index.json", data, size);
  auto m = klein::ModelFolder::open(scratch.dir());
  if (!m.ok()) return 0;
  (void)m->pipeline_class();
  for (const auto& [name, info] : m->components()) {
    (void)m->component(name);
    // Only names that stay inside the folder: a key like ".." would make config() read files
    // elsewhere, which is model_folder.cpp's business (reported), not a crash to hunt here.
    if (name.find('/') == std::string::npos && name.find("..") == std::string::npos) (void)m->config(name);
  }
  (void)m->component("transformer");
  return 0;
}
