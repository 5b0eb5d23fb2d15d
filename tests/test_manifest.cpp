// Integrity manifests (`klein manifest`, `--verify`, quantize's manifest.json): SHA-256 against
// the standard's vectors and coreutils' sha256sum (an independent implementation), the files a
// layout reads, and every way a model can differ from its manifest, each one error line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "api/layout.h"
#include "api/manifest.h"
#include "io/manifest.h"
#include "io/sha256.h"
#include "klein/klein.h"
#include "testing.h"

namespace fs = std::filesystem;

namespace klein {
namespace manifest_test {

using klein::testing::run_cli;

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

// coreutils' digest of a file: the independent reference.
std::string sha256sum(const fs::path& p) {
  const std::string cmd = "sha256sum " + quoted(p);
  std::FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return {};
  char buf[128] = {};
  const size_t n = std::fread(buf, 1, 64, f);
  ::pclose(f);
  return std::string(buf, n);
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A copy of the tiny model folder (the tests change files in it).
fs::path tiny_copy(const std::string& tag) {
  const fs::path dir = testing::make_temp_dir(tag) / "tiny";
  fs::copy(testing::tiny_model_dir(), dir, fs::copy_options::recursive);
  return dir;
}

TEST(Sha256, StandardVectors) {
  // FIPS 180-2, appendix B: one block, two blocks, and a million 'a's.
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, FilesMatchSha256sumAcrossBlocks) {
  const fs::path dir = testing::make_temp_dir("sha256");
  std::mt19937 rng(7);
  // Sizes around the reader's 4 MiB block and SHA-256's 64-byte block.
  const size_t sizes[] = {0, 1, 63, 64, 65, (size_t{4} << 20) - 1, (size_t{4} << 20) + 3, (size_t{9} << 20) + 17};
  std::vector<fs::path> paths;
  for (size_t s : sizes) {
    std::string bytes(s, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    paths.push_back(dir / ("f" + std::to_string(s)));
    write_bytes(paths.back(), bytes);
  }
  auto one = sha256_file(paths.back());
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(one->size, sizes[std::size(sizes) - 1]);
  EXPECT_EQ(one->sha256, sha256sum(paths.back()));
  for (int threads : {1, 3}) {
    auto all = sha256_files(paths, threads);
    ASSERT_TRUE(all.ok()) << all.status().message();
    ASSERT_EQ(all->size(), paths.size());
    for (size_t i = 0; i < paths.size(); ++i) {
      EXPECT_EQ((*all)[i].size, sizes[i]);
      EXPECT_EQ((*all)[i].sha256, sha256sum(paths[i])) << paths[i];
    }
  }
  auto missing = sha256_files({paths[0], dir / "nope"}, 2);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope: cannot open"), std::string::npos) << missing.status().message();
  int polls = 0;
  auto stopped = sha256_file(paths.back(), [&] { return ++polls > 1; });
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), Code::kCancelled);
}

TEST(Manifest, ListsWhatAFolderLoadReadsWithSha256sumDigests) {
  auto text = make_manifest(testing::tiny());
  ASSERT_TRUE(text.ok()) << text.status().message();
  auto m = parse_manifest(*text, "manifest");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->layout, "diffusers folder");
  EXPECT_EQ(m->variant, "distilled");
  std::set<std::string> paths;
  for (const ManifestFile& f : m->files) {
    paths.insert(f.role + ":" + f.path);
    const fs::path p = testing::tiny_model_dir() / f.path;
    EXPECT_EQ(f.size, fs::file_size(p)) << f.path;
    EXPECT_EQ(f.sha256, sha256sum(p)) << f.path;
  }
  for (const char* want : {"pipeline:model_index.json", "scheduler:scheduler/scheduler_config.json",
                           "tokenizer:tokenizer/tokenizer.json", "transformer:transformer/config.json",
                           "transformer:transformer/diffusion_pytorch_model.safetensors", "vae:vae/config.json",
                           "vae:vae/diffusion_pytorch_model.safetensors", "text_encoder:text_encoder/config.json"})
    EXPECT_EQ(paths.count(want), 1u) << want << " missing from " << *text;
  // The text encoder's weights (sharded or not) are all there.
  bool te_weights = false;
  for (const std::string& p : paths) te_weights |= p.starts_with("text_encoder:") && p.ends_with(".safetensors");
  EXPECT_TRUE(te_weights);
  // What klein detected, for people.
  EXPECT_FALSE(m->components["transformer"]["formats"].empty());
  EXPECT_FALSE(m->components["vae"]["description"].get<std::string>().empty());
}

TEST(Manifest, VerifiesACopyAndNamesEachDifference) {
  const fs::path dir = tiny_copy("manifest-verify");
  const fs::path manifest = dir.parent_path() / "tiny.manifest.json";
  // Written from the shipped folder, checked against the copy: paths are relative.
  ASSERT_TRUE(write_manifest(testing::tiny(), {}, manifest.string()).ok());
  ASSERT_TRUE(verify_manifest(manifest.string(), dir.string()).ok());
  LoadOptions lo;
  lo.verify_manifest = manifest.string();
  auto opened = Model::open(dir.string(), lo);
  ASSERT_TRUE(opened.ok()) << opened.status().message();

  auto expect_error = [&](const std::string& part, const std::string& why) {
    Status st = verify_manifest(manifest.string(), dir.string());
    ASSERT_FALSE(st.ok()) << why;
    EXPECT_EQ(st.message().find('\n'), std::string::npos);
    EXPECT_NE(st.message().find(part), std::string::npos) << why << ": " << st.message();
    auto m = Model::open(dir.string(), lo);  // the load refuses before reading weights
    ASSERT_FALSE(m.ok()) << why;
    EXPECT_EQ(m.status().message(), st.message());
  };
  // One byte changed, same size: only the hash tells.
  const fs::path vae = dir / "vae" / "diffusion_pytorch_model.safetensors";
  const std::string original = read_all(vae);
  std::string changed = original;
  changed[changed.size() / 2] ^= 1;
  write_bytes(vae, changed);
  expect_error("SHA-256", "a flipped bit");
  expect_error(vae.string(), "a flipped bit names the file");
  write_bytes(vae, original.substr(0, original.size() - 8));
  expect_error("bytes; the manifest says " + std::to_string(original.size()), "a truncated file");
  write_bytes(vae, original);
  ASSERT_TRUE(verify_manifest(manifest.string(), dir.string()).ok());
  // A shard the manifest does not know, then a listed file gone.
  write_bytes(dir / "transformer" / "extra.safetensors", read_all(dir / "transformer" / "diffusion_pytorch_model.safetensors"));
  expect_error("which the manifest does not list", "an added shard");
  fs::remove(dir / "transformer" / "extra.safetensors");
  fs::remove(dir / "tokenizer" / "tokenizer.json");
  write_bytes(dir / "tokenizer" / "vocab.json", "{}");
  write_bytes(dir / "tokenizer" / "merges.txt", "#version: 0.2\n");
  Status st = verify_manifest(manifest.string(), dir.string());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("tokenizer"), std::string::npos) << st.message();
}

TEST(Manifest, SingleFilesAndTheAllInOneAreNamedByFileName) {
  const fs::path aio = testing::data_dir() / "single_file" / "tiny-flux2-all-in-one.safetensors";
  auto text = make_manifest(aio.string());
  ASSERT_TRUE(text.ok()) << text.status().message();
  auto m = parse_manifest(*text, "manifest");
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ(m->files.size(), 1u) << *text;  // one file, three roles; tokenizer and scheduler built in
  EXPECT_EQ(m->files[0].path, aio.filename().string());
  EXPECT_EQ(m->files[0].role, "text_encoder+transformer+vae");
  EXPECT_EQ(m->files[0].sha256, sha256sum(aio));
  EXPECT_EQ(m->layout, "all-in-one checkpoint");
  // The same file elsewhere verifies; the same manifest against another file does not.
  const fs::path dir = testing::make_temp_dir("manifest-aio");
  fs::copy_file(aio, dir / aio.filename());
  write_bytes(dir / "m.json", *text);
  EXPECT_TRUE(verify_manifest((dir / "m.json").string(), (dir / aio.filename()).string()).ok());
  LoadOptions files;
  files.diffusion_model = (testing::data_dir() / "single_file" / "tiny-flux2-bfl.safetensors").string();
  Status st = verify_manifest((dir / "m.json").string(), testing::tiny(), files);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("does not list"), std::string::npos) << st.message();
}

TEST(Manifest, MalformedManifestsAreOneLineErrors) {
  const std::string ok_file =
      R"({"role": "vae", "path": "vae/x.safetensors", "size": 3, "sha256": ")" + std::string(64, 'a') + "\"}";
  auto with_files = [](const std::string& files) { return R"({"klein_manifest": 1, "files": [)" + files + "]}"; };
  ASSERT_TRUE(parse_manifest(with_files(ok_file), "m.json").ok());
  const std::pair<std::string, std::string> bad[] = {
      {"not json", "not valid JSON"},
      {"[]", "expected a JSON object"},
      {R"({"files": []})", "not a klein manifest"},
      {R"({"klein_manifest": 2, "files": []})", "version 2"},
      {R"({"klein_manifest": 1})", "\"files\" must be an array"},
      {with_files(""), "\"files\" is empty"},
      {with_files("3"), "files[0]: expected an object"},
      {with_files(R"({"role": "vae", "path": "x", "size": 1, "sha256": "abc"})"), "64 lowercase hex"},
      {with_files(R"({"role": "vae", "path": "/etc/passwd", "size": 1, "sha256": ")" + std::string(64, 'a') + "\"}"),
       "not a relative path"},
      {with_files(R"({"role": "vae", "path": "a/../../b", "size": 1, "sha256": ")" + std::string(64, 'a') + "\"}"),
       "not a relative path"},
      {with_files(R"({"role": "vae", "path": "x", "size": -1, "sha256": ")" + std::string(64, 'a') + "\"}"),
       "non-negative integer"},
      {with_files(R"({"path": "x", "size": 1, "sha256": ")" + std::string(64, 'a') + "\"}"), "missing \"role\""},
      {with_files(ok_file + "," + ok_file), "listed twice"},
  };
  for (const auto& [text, want] : bad) {
    auto m = parse_manifest(text, "m.json");
    ASSERT_FALSE(m.ok()) << text;
    EXPECT_EQ(m.status().message().rfind("m.json", 0), 0u) << m.status().message();
    EXPECT_NE(m.status().message().find(want), std::string::npos) << text << " -> " << m.status().message();
  }
  // A manifest that is not there, through the load.
  LoadOptions lo;
  lo.verify_manifest = "/nonexistent/manifest.json";
  auto m = Model::open(testing::tiny(), lo);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("/nonexistent/manifest.json"), std::string::npos);
}

TEST(Manifest, QuantizeWritesOneForItsOutput) {
  const fs::path dir = testing::make_temp_dir("manifest-quantize");
  QuantizeOptions q;
  q.model = testing::tiny();
  q.output = (dir / "q8").string();
  q.type = "q8";
  q.threads = 2;
  ASSERT_TRUE(quantize_model(q).ok());
  const fs::path manifest = dir / "q8" / "manifest.json";
  ASSERT_TRUE(fs::exists(manifest));
  EXPECT_TRUE(verify_manifest(manifest.string(), q.output).ok());
  auto m = parse_manifest(read_all(manifest), "manifest");
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->components["transformer"]["formats"].contains("Q8_ROW")) << m->components.dump();
  // --verify on quantize's input: a wrong manifest stops it before any output exists.
  q.output = (dir / "q8b").string();
  q.verify_manifest = manifest.string();  // the q8 folder's, not the input's
  Status st = quantize_model(q);
  ASSERT_FALSE(st.ok());
  EXPECT_FALSE(fs::exists(dir / "q8b"));
}

TEST(Manifest, Cli) {
  const fs::path dir = testing::make_temp_dir("manifest-cli");
  auto r = run_cli("manifest --model " + quoted(testing::tiny_model_dir()) + " -o " + quoted(dir / "m.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("manifest --model " + quoted(testing::tiny_model_dir()) + " --verify " + quoted(dir / "m.json"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("verified"), std::string::npos) << r.err;
  r = run_cli("manifest --model " + quoted(testing::tiny_model_dir()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, read_all(dir / "m.json"));
  // Another model against it: exit 1, one line.
  const fs::path aio = testing::data_dir() / "single_file" / "tiny-flux2-all-in-one.safetensors";
  r = run_cli("info --model " + quoted(aio) + " --verify " + quoted(dir / "m.json"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("klein: format error: --verify "), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace manifest_test
}  // namespace klein
