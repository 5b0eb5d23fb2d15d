// klein._klein: the Python binding of the public C++ API (include/klein/klein.h), with nanobind.
// The diffusers-style pipeline and argument checking are Python (klein/pipeline.py); this file
// turns engine calls into Python calls:
//   * every long call runs on a worker thread with the GIL released, while the calling thread
//     waits in short slices and checks for signals (PyErr_CheckSignals, which runs Python's
//     SIGINT handler on the main thread): a KeyboardInterrupt sets the engine's cancel flag, the
//     engine stops at its next poll (between layers), and the interrupt is raised once the call
//     has returned, leaving the Model usable;
//   * callbacks from the engine (progress, preview, log) take the GIL on the worker; an
//     exception raised in one cancels the call and is re-raised by it;
//   * a Status becomes klein.Error's subclass for its code, carrying the engine's message;
//   * arrays leave without a copy (numpy arrays owning the engine's vectors).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "klein/klein.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// ---- errors -------------------------------------------------------------------------------------

// klein.Error and one subclass per Status code (index: the Code's value; kOk unused).
PyObject* g_errors[9] = {};

// Engine text as a Python str: bytes that are not UTF-8 (a file name) become U+FFFD, never an error.
nb::str py_str(const std::string& s) {
  return nb::steal<nb::str>(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"));
}

[[noreturn]] void raise_status(const klein::Status& s) {
  const int c = static_cast<int>(s.code());
  PyObject* type = (c > 0 && c < 9) ? g_errors[c] : g_errors[static_cast<int>(klein::Code::kInternal)];
  nb::object exc = nb::borrow(type)(py_str(s.message()));
  exc.attr("code") = nb::str(klein::code_name(s.code()));
  PyErr_SetObject(type, exc.ptr());
  throw nb::python_error();
}

void check(const klein::Status& s) {
  if (!s.ok()) raise_status(s);
}
template <class T>
T take(klein::Result<T>&& r) {
  if (!r.ok()) raise_status(r.status());
  return std::move(r).value();
}

[[noreturn]] void value_error(const std::string& m) {
  PyErr_SetString(PyExc_ValueError, m.c_str());
  throw nb::python_error();
}

// ---- arrays -------------------------------------------------------------------------------------

// A numpy array that owns `v` (no copy: the vector moves into the capsule that frees it).
template <class T>
nb::ndarray<nb::numpy, T> owned(std::vector<T>&& v, const std::vector<int64_t>& shape) {
  auto* holder = new std::vector<T>(std::move(v));
  nb::capsule owner(holder, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  std::vector<size_t> dims(shape.begin(), shape.end());
  return nb::ndarray<nb::numpy, T>(holder->data(), dims.size(), dims.data(), owner);
}

nb::ndarray<nb::numpy, uint8_t> image_array(klein::Image&& img) {
  return owned(std::move(img.rgb), {img.height, img.width, 3});
}

using InFloat = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using InU8 = nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu>;

// Inputs are copied once into the API's vectors (FloatArray owns its data).
klein::FloatArray float_array(const InFloat& a) {
  klein::FloatArray r;
  for (size_t i = 0; i < a.ndim(); ++i) r.shape.push_back(static_cast<int64_t>(a.shape(i)));
  r.data.assign(a.data(), a.data() + a.size());
  return r;
}

klein::Image image_from(const InU8& a, const char* what) {
  if (a.ndim() != 3 || a.shape(2) != 3 || a.shape(0) < 1 || a.shape(1) < 1)
    value_error(std::string(what) + ": expected an RGB image array of shape (height, width, 3), uint8");
  klein::Image img;
  img.height = static_cast<int>(a.shape(0));
  img.width = static_cast<int>(a.shape(1));
  img.rgb.assign(a.data(), a.data() + a.size());
  return img;
}

// ---- calls off the GIL, cancellable -------------------------------------------------------------

// Python callables for one call (None: not wanted).
struct Hooks {
  nb::object progress, preview, log;
};

struct CallState {
  std::atomic<bool> cancel{false};
  std::optional<nb::python_error> error;  // raised by a hook (set and read with the GIL held)
};

// The callbacks hold pointers, not Python references: the engine may copy them off the GIL. `h`
// and `st` outlive the call (run_released's frame).
klein::Callbacks make_callbacks(const Hooks& h, CallState* st) {
  klein::Callbacks cb;
  const Hooks* hp = &h;
  cb.cancel = [st] { return st->cancel.load(std::memory_order_relaxed); };
  // Runs fn under the GIL; a Python exception cancels the call and is kept for the caller.
  auto guarded = [st](auto&& fn) {
    nb::gil_scoped_acquire gil;
    if (st->error) return;
    try {
      fn();
    } catch (nb::python_error& e) {
      st->error.emplace(std::move(e));
      st->cancel = true;
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      st->error.emplace();
      st->cancel = true;
    }
  };
  if (!h.progress.is_none())
    cb.progress = [hp, guarded](const std::string& phase, int done, int total) {
      guarded([&] { hp->progress(py_str(phase), done, total); });
    };
  if (!h.log.is_none())
    cb.log = [hp, guarded](const std::string& line) { guarded([&] { hp->log(py_str(line)); }); };
  if (!h.preview.is_none())
    cb.preview = [hp, guarded](int step, int total, const klein::Image& img) {
      guarded([&] {
        klein::Image copy = img;  // the engine keeps its own; the callback may keep this one
        hp->preview(step, total, image_array(std::move(copy)));
      });
    };
  return cb;
}

// Runs f(callbacks) on a worker thread with the GIL released. The caller checks for signals every
// 20 ms; a KeyboardInterrupt (or any exception from a signal handler) cancels the engine call and
// is raised after it returned, as is an exception from a hook. Otherwise returns f's result.
template <class F>
auto run_released(const Hooks& hooks, F&& f) -> decltype(f(std::declval<const klein::Callbacks&>())) {
  using R = decltype(f(std::declval<const klein::Callbacks&>()));
  CallState st;
  const klein::Callbacks cb = make_callbacks(hooks, &st);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::optional<R> result;
  std::optional<nb::python_error> interrupt;
  std::thread worker;
  {
    nb::gil_scoped_release release;
    worker = std::thread([&] {
      R r = f(cb);
      std::lock_guard<std::mutex> lock(mu);
      result.emplace(std::move(r));
      done = true;
      cv.notify_all();
    });
  }
  for (;;) {
    {
      nb::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(mu);
      if (cv.wait_for(lock, std::chrono::milliseconds(20), [&] { return done; })) break;
    }
    if (!interrupt && PyErr_CheckSignals() != 0) {
      interrupt.emplace();  // fetches the pending KeyboardInterrupt
      st.cancel = true;
    }
  }
  {
    nb::gil_scoped_release release;
    worker.join();
  }
  if (st.error) throw std::move(*st.error);
  if (interrupt) throw std::move(*interrupt);
  return std::move(*result);
}

// ---- option parsing -----------------------------------------------------------------------------

klein::Precision parse_precision(const std::string& s) {
  if (s == "fast") return klein::Precision::kFast;
  if (s == "fp32") return klein::Precision::kFp32;
  value_error("precision '" + s + "': expected 'fast' (default) or 'fp32'");
}
klein::BackendKind parse_backend(const std::string& s) {
  if (s == "auto") return klein::BackendKind::kAuto;
  if (s == "cpu") return klein::BackendKind::kCpu;
  if (s == "cuda") return klein::BackendKind::kCuda;
  value_error("backend '" + s + "': expected 'auto', 'cpu' or 'cuda'");
}
klein::MemoryPolicy parse_memory(const std::string& s) {
  if (s == "resident") return klein::MemoryPolicy::kResident;
  if (s == "low") return klein::MemoryPolicy::kLow;
  value_error("memory '" + s + "': expected 'resident' or 'low'");
}
klein::Variant parse_variant(const std::string& s) {
  if (s == "auto") return klein::Variant::kAuto;
  if (s == "distilled") return klein::Variant::kDistilled;
  if (s == "base") return klein::Variant::kBase;
  value_error("variant '" + s + "': expected 'auto', 'distilled' or 'base'");
}

// ---- Model / Session ----------------------------------------------------------------------------

struct PyModel {
  std::unique_ptr<klein::Model> model;
  std::string path;
};

struct PySession {
  nb::object owner;  // the PyModel (kept alive: the Session borrows its Model)
  std::unique_ptr<klein::Session> session;
  std::mutex mu;  // one call at a time (a Session is not thread-safe; the GIL is released)
};

// f() under the Session's lock, waited for without the GIL: a call of this Session running on
// another Python thread holds the lock and may need the GIL for its callbacks.
template <class F>
auto locked(PySession& s, F&& f) -> decltype(f()) {
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(s.mu);
  return f();
}

nb::dict embeddings_dict(klein::PromptEmbeddings&& e) {
  nb::dict d;
  const int64_t n = static_cast<int64_t>(e.ids.size());
  d["prompt_embeds"] = owned(std::move(e.data), e.shape);
  d["input_ids"] = owned(std::move(e.ids), {1, n});
  d["attention_mask"] = owned(std::move(e.mask), {1, n});
  d["num_real_tokens"] = e.num_real_tokens;
  d["untruncated_length"] = e.untruncated_length;
  return d;
}

}  // namespace

NB_MODULE(_klein, m) {
  m.doc() = "klein.cpp's C++ engine (FLUX.2 [klein]); use the klein package, not this module";

  // Errors: klein.Error, then one subclass per engine Status code, each also a subclass of the
  // builtin exception a Python user would catch for it.
  {
    PyObject* base = PyErr_NewExceptionWithDoc("klein.Error", "An error from the klein engine; .code names its kind.",
                                               PyExc_Exception, nullptr);
    g_errors[0] = base;
    m.attr("Error") = nb::borrow(base);
    struct Sub {
      klein::Code code;
      const char* name;
      PyObject* builtin;
      const char* doc;
    };
    const Sub subs[] = {
        {klein::Code::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError, "A bad option or value."},
        {klein::Code::kNotFound, "NotFoundError", PyExc_FileNotFoundError, "A missing file, tensor or key."},
        {klein::Code::kIoError, "IoError", PyExc_OSError, "A read, write or mmap failure."},
        {klein::Code::kFormatError, "FormatError", PyExc_ValueError, "Malformed file contents."},
        {klein::Code::kUnsupported, "UnsupportedError", PyExc_NotImplementedError, "Well-formed but not handled."},
        {klein::Code::kCancelled, "CancelledError", nullptr, "The call was cancelled."},
        {klein::Code::kOutOfMemory, "OutOfMemoryError", PyExc_MemoryError, "An allocation failed."},
        {klein::Code::kInternal, "InternalError", PyExc_RuntimeError, "A bug in the engine."},
    };
    for (const Sub& s : subs) {
      nb::object bases = s.builtin ? nb::object(nb::make_tuple(nb::borrow(base), nb::borrow(s.builtin)))
                                   : nb::object(nb::make_tuple(nb::borrow(base)));
      const std::string qual = std::string("klein.") + s.name;
      PyObject* t = PyErr_NewExceptionWithDoc(qual.c_str(), s.doc, bases.ptr(), nullptr);
      if (!t) throw nb::python_error();
      g_errors[static_cast<int>(s.code)] = t;
      m.attr(s.name) = nb::borrow(t);
    }
  }

  m.def("version", [] { return std::string(klein::version()); });
  m.def("cpu_info", [](const std::string& isa) { return py_str(take(klein::cpu_info(isa))); }, "isa"_a = "");

  nb::class_<PyModel>(m, "Model")
      .def_static(
          "open",
          [](const std::string& path, int threads, const std::string& memory, const std::string& precision,
             const std::string& backend, double max_memory, const std::string& isa, int vae_tile,
             const std::string& diffusion_model, const std::string& text_encoder, const std::string& vae,
             const std::string& variant, const std::string& verify_manifest) {
            klein::LoadOptions o;
            o.threads = threads;
            o.memory = parse_memory(memory);
            o.precision = parse_precision(precision);
            o.backend = parse_backend(backend);
            o.max_memory_gib = max_memory;
            o.isa = isa;
            o.vae_tile = vae_tile;
            o.diffusion_model = diffusion_model;
            o.text_encoder = text_encoder;
            o.vae = vae;
            o.variant = parse_variant(variant);
            o.verify_manifest = verify_manifest;
            auto r = run_released(Hooks{nb::none(), nb::none(), nb::none()},
                                  [&](const klein::Callbacks&) { return klein::Model::open(path, o); });
            auto pm = std::make_unique<PyModel>();
            pm->model = take(std::move(r));
            pm->path = path;
            return pm;
          },
          "path"_a, "threads"_a = 0, "memory"_a = "resident", "precision"_a = "fast", "backend"_a = "auto",
          "max_memory"_a = 0.0, "isa"_a = "", "vae_tile"_a = 0, "diffusion_model"_a = "", "text_encoder"_a = "",
          "vae"_a = "", "variant"_a = "auto", "verify_manifest"_a = "")
      .def_prop_ro("distilled", [](const PyModel& p) { return p.model->distilled(); })
      .def_prop_ro("backend", [](const PyModel& p) { return p.model->backend_name(); })
      .def_prop_ro("path", [](const PyModel& p) { return p.path; })
      .def_prop_ro("precision",
                   [](const PyModel& p) {
                     return std::string(p.model->load_options().precision == klein::Precision::kFast ? "fast" : "fp32");
                   })
      .def_prop_ro("notes",
                   [](const PyModel& p) {
                     nb::list l;
                     for (const auto& n : p.model->notes()) l.append(py_str(n));
                     return l;
                   })
      .def(
          "encode_prompt",
          [](PyModel& p, const std::string& prompt, int max_length, nb::object progress, nb::object log) {
            klein::EncodeOptions eo;
            eo.max_length = max_length;
            auto r = run_released(Hooks{progress, nb::none(), log}, [&](const klein::Callbacks& cb) {
              return p.model->encode_prompt(prompt, eo, cb);
            });
            return embeddings_dict(take(std::move(r)));
          },
          "prompt"_a, "max_length"_a = 512, "progress"_a = nb::none(), "log"_a = nb::none())
      .def(
          "tokenize",
          [](const PyModel& p, const std::string& text, bool chat_template, int max_length) {
            auto r = take(p.model->tokenize(text, chat_template, max_length));
            const int64_t n = static_cast<int64_t>(r.ids.size());
            return nb::make_tuple(owned(std::move(r.ids), {n}), owned(std::move(r.mask), {static_cast<int64_t>(r.mask.size())}));
          },
          "text"_a, "chat_template"_a = false, "max_length"_a = 0)
      .def(
          "decode",
          [](PyModel& p, const InFloat& latents, nb::object progress, nb::object log) {
            klein::Latents l;
            static_cast<klein::FloatArray&>(l) = float_array(latents);
            auto r = run_released(Hooks{progress, nb::none(), log},
                                  [&](const klein::Callbacks& cb) { return p.model->decode(l, cb); });
            return image_array(take(std::move(r)));
          },
          "latents"_a, "progress"_a = nb::none(), "log"_a = nb::none())
      .def(
          "estimate_memory",
          [](const PyModel& p, int width, int height, const std::vector<std::pair<int, int>>& references,
             double guidance_scale, bool inpaint) {
            klein::RequestSize rs;
            rs.width = width;
            rs.height = height;
            rs.references = references;
            rs.guidance_scale = guidance_scale;
            rs.inpaint = inpaint;
            auto e = take(p.model->estimate_memory(rs));
            nb::dict d;
            d["width"] = e.width;
            d["height"] = e.height;
            d["image_tokens"] = e.image_tokens;
            d["reference_tokens"] = e.reference_tokens;
            d["guidance"] = e.guidance;
            d["resident_bytes"] = e.resident_bytes;
            d["minimum_bytes"] = e.minimum_bytes;
            d["resident_plan"] = py_str(e.resident_plan);
            d["minimum_plan"] = py_str(e.minimum_plan);
            return d;
          },
          "width"_a = 0, "height"_a = 0, "references"_a = std::vector<std::pair<int, int>>{},
          "guidance_scale"_a = -1.0, "inpaint"_a = false);

  nb::class_<PySession>(m, "Session")
      .def(
          "__init__",
          [](PySession* s, nb::handle model, double guidance_scale, const std::string& negative_prompt) {
            PyModel& pm = nb::cast<PyModel&>(model);
            klein::SessionOptions so;
            so.guidance_scale = guidance_scale;
            so.negative_prompt = negative_prompt;
            auto session = take(klein::Session::create(*pm.model, so));
            new (s) PySession();
            s->owner = nb::borrow(model);
            s->session = std::move(session);
          },
          "model"_a, "guidance_scale"_a = -1.0, "negative_prompt"_a = "")
      .def_prop_ro("guided", [](const PySession& s) { return s.session->guided(); })
      .def_prop_ro("guidance_scale", [](const PySession& s) { return s.session->guidance_scale(); })
      .def_prop_ro("width", [](PySession& s) { return locked(s, [&] { return s.session->width(); }); })
      .def_prop_ro("height", [](PySession& s) { return locked(s, [&] { return s.session->height(); }); })
      .def_prop_ro("steps", [](PySession& s) { return locked(s, [&] { return s.session->steps(); }); })
      .def(
          "encode_prompt",
          [](PySession& s, const std::string& prompt, nb::object progress, nb::object log) {
            check(run_released(Hooks{progress, nb::none(), log}, [&](const klein::Callbacks& cb) {
              std::lock_guard<std::mutex> lock(s.mu);
              return s.session->encode_prompt(prompt, cb);
            }));
          },
          "prompt"_a, "progress"_a = nb::none(), "log"_a = nb::none())
      .def(
          "set_prompt_embeddings",
          [](PySession& s, const InFloat& embeds, std::optional<InFloat> negative, nb::object progress, nb::object log) {
            const klein::FloatArray e = float_array(embeds);
            const klein::FloatArray n = negative ? float_array(*negative) : klein::FloatArray{};
            check(run_released(Hooks{progress, nb::none(), log}, [&](const klein::Callbacks& cb) {
              std::lock_guard<std::mutex> lock(s.mu);
              return s.session->set_prompt_embeddings(e, n, cb);
            }));
          },
          "embeds"_a, "negative"_a = nb::none(), "progress"_a = nb::none(), "log"_a = nb::none())
      .def(
          "set_references",
          [](PySession& s, const std::vector<std::string>& paths, const std::vector<std::pair<std::string, nb::bytes>>& data) {
            std::vector<klein::ReferenceImage> refs;
            for (const auto& [name, bytes] : data) {
              const auto* b = static_cast<const uint8_t*>(bytes.data());
              refs.push_back({name, std::vector<uint8_t>(b, b + bytes.size())});
            }
            check(run_released(Hooks{nb::none(), nb::none(), nb::none()}, [&](const klein::Callbacks&) {
              std::lock_guard<std::mutex> lock(s.mu);
              return s.session->set_references(paths, refs);
            }));
          },
          "paths"_a, "data"_a)
      .def(
          "denoise",
          [](PySession& s, int width, int height, int steps, uint64_t seed, std::optional<InFloat> noise, bool bf16_noise,
             nb::object progress, nb::object preview, nb::object log) {
            klein::DenoiseParams p;
            p.width = width;
            p.height = height;
            p.steps = steps;
            p.seed = seed;
            p.bf16_noise = bf16_noise;
            if (noise) {
              p.noise = float_array(*noise);
              p.noise_name = "latents";
            }
            check(run_released(Hooks{progress, preview, log}, [&](const klein::Callbacks& cb) {
              std::lock_guard<std::mutex> lock(s.mu);
              return s.session->denoise(p, cb);
            }));
          },
          "width"_a = 0, "height"_a = 0, "steps"_a = 0, "seed"_a = 0, "noise"_a = nb::none(), "bf16_noise"_a = false,
          "progress"_a = nb::none(), "preview"_a = nb::none(), "log"_a = nb::none())
      .def("latents",
           [](PySession& s) {
             klein::Latents l = take(locked(s, [&] { return s.session->latents(); }));
             return owned(std::move(l.data), l.shape);
           })
      .def(
          "decode",
          [](PySession& s, nb::object progress, nb::object log) {
            auto r = run_released(Hooks{progress, nb::none(), log}, [&](const klein::Callbacks& cb) {
              std::lock_guard<std::mutex> lock(s.mu);
              return s.session->decode(cb);
            });
            return image_array(take(std::move(r)));
          },
          "progress"_a = nb::none(), "log"_a = nb::none());

  m.def(
      "randn",
      [](const std::vector<int64_t>& shape, uint64_t seed, bool bf16) {
        klein::FloatArray a = take(klein::randn(shape, seed, bf16));
        return owned(std::move(a.data), a.shape);
      },
      "shape"_a, "seed"_a, "bf16"_a = false);

  m.def(
      "save_png",
      [](const std::string& path, const InU8& image, const std::vector<std::pair<std::string, std::string>>& metadata) {
        const klein::Image img = image_from(image, "save_png");
        klein::Status st;
        {
          nb::gil_scoped_release release;
          st = klein::save_png(path, img, metadata);
        }
        check(st);
      },
      "path"_a, "image"_a, "metadata"_a = std::vector<std::pair<std::string, std::string>>{});

  m.def(
      "encode_image",
      [](const InU8& image, const std::string& format, const std::vector<std::pair<std::string, std::string>>& metadata,
         int quality) {
        klein::ImageFileFormat f = klein::ImageFileFormat::kPng;
        if (format == "jpeg") f = klein::ImageFileFormat::kJpeg;
        else if (format == "webp") f = klein::ImageFileFormat::kWebp;
        else if (format != "png") value_error("format '" + format + "': expected 'png', 'jpeg' or 'webp'");
        const klein::Image img = image_from(image, "encode_image");
        auto bytes = take(klein::encode_image(img, f, metadata, quality));
        return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      },
      "image"_a, "format"_a = "png", "metadata"_a = std::vector<std::pair<std::string, std::string>>{},
      "quality"_a = 90);

  m.def(
      "decode_image",
      [](nb::bytes data, const std::string& name) {
        const auto* b = static_cast<const uint8_t*>(data.data());
        std::vector<uint8_t> v(b, b + data.size());
        return image_array(take(klein::decode_image(v, name)));
      },
      "data"_a, "name"_a = "image");

  m.def(
      "quantize",
      [](const std::string& model, const std::string& output, const std::string& type, const std::string& flavor,
         const std::vector<std::string>& keep, int threads, const std::string& diffusion_model,
         const std::string& text_encoder, const std::string& vae, const std::string& variant,
         const std::string& verify_manifest, nb::object progress, nb::object log) {
        klein::QuantizeOptions q;
        q.model = model;
        q.output = output;
        q.type = type;
        q.flavor = flavor;
        q.keep = keep;
        q.threads = threads;
        q.diffusion_model = diffusion_model;
        q.text_encoder = text_encoder;
        q.vae = vae;
        q.variant = parse_variant(variant);
        q.verify_manifest = verify_manifest;
        check(run_released(Hooks{progress, nb::none(), log},
                           [&](const klein::Callbacks& cb) { return klein::quantize_model(q, cb); }));
      },
      "model"_a, "output"_a, "type"_a = "q8", "flavor"_a = "comfy", "keep"_a = std::vector<std::string>{},
      "threads"_a = 0, "diffusion_model"_a = "", "text_encoder"_a = "", "vae"_a = "", "variant"_a = "auto",
      "verify_manifest"_a = "", "progress"_a = nb::none(), "log"_a = nb::none());

  auto image_cmp = [](const klein::ImageComparison& c) {
    return nb::make_tuple(c.psnr, c.ssim, c.correlation);
  };
  auto array_cmp = [](const klein::ArrayComparison& c) {
    return nb::make_tuple(c.cosine, c.rel_l2, c.max_abs, c.count);
  };
  m.def("compare_images", [image_cmp](const InU8& a, const InU8& b) {
    return image_cmp(take(klein::compare_images(image_from(a, "compare a"), image_from(b, "compare b"))));
  });
  m.def("compare_image_files", [image_cmp](const std::string& a, const std::string& b) {
    return image_cmp(take(klein::compare_image_files(a, b)));
  });
  m.def("compare_arrays", [array_cmp](const InFloat& a, const InFloat& b) {
    return array_cmp(take(klein::compare_arrays(float_array(a), float_array(b))));
  });
  m.def("compare_npy_files", [array_cmp](const std::string& a, const std::string& b) {
    return array_cmp(take(klein::compare_npy_files(a, b)));
  });
}
