// Seamless tiled (windowed) VAE decoding and encoding, in the Backend's named ops only.
//
// The full-resolution part of the VAE (decoder: the up blocks and conv_norm_out/conv_out;
// encoder: conv_in and the down blocks) runs on tiles; the rest — up to the decoder's mid block,
// from the encoder's mid block on, with its global attention — runs whole at the latent
// resolution, which is small. Two things make the result equal the whole-image pass:
//   * halos: a tile computes the region of every intermediate its output depends on (each 3×3
//     conv reads one pixel further, upsampling halves and downsampling doubles the reach), and
//     convs zero-pad only at the image's borders, so every value is computed from the same
//     inputs as untiled;
//   * global GroupNorm statistics: before a GroupNorm is applied, one pass over all tiles
//     accumulates its per-group statistics over each tile's own core (Backend::group_norm_stats),
//     then the affine is computed once for the whole image. The passes recompute the chain from
//     the last activation kept whole; an activation is kept whole in memory when it fits the
//     tiling's keep budget, else in a temporary file (io/activation_spill.h) when spilling is
//     allowed, so each pass computes one stage from the previous point, not the chain.
#include <algorithm>
#include <map>
#include <memory>

#include "backend/buffer_pool.h"
#include "io/activation_spill.h"
#include "models/flux2_vae.h"

namespace klein {

namespace {

struct Span {
  int64_t a = 0, b = 0;  // [a, b)
  int64_t len() const { return b - a; }
  bool operator==(const Span&) const = default;
};
struct Region {
  Span y, x;
  bool operator==(const Region&) const = default;
};
struct Size2 {
  int64_t h = 0, w = 0;
};

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

Span clamp(Span s, int64_t n) { return {std::max<int64_t>(s.a, 0), std::min(s.b, n)}; }
Region grow(const Region& r, int64_t k, Size2 n) {
  return {clamp({r.y.a - k, r.y.b + k}, n.h), clamp({r.x.a - k, r.x.b + k}, n.w)};
}

// A tensor [1, C, h, w] holding `region` of an activation of size `full`.
struct Tile {
  Tensor t;
  Region r;
};

enum class Kind { kConv, kResnet, kUp, kDown, kNormConv };

struct Stage {
  Kind kind;
  const Flux2Vae::Resnet* res = nullptr;
  const Flux2Vae::Conv* conv = nullptr;
  const Flux2Vae::Norm* norm = nullptr;  // kNormConv
  Size2 in, out;
};

// The input rows a stage reads for output rows [a, b) (one axis).
Span input_span(Kind k, Span o, int64_t n_in) {
  switch (k) {
    case Kind::kUp:  // nearest ×2 then 3×3: output o reads upsampled o−1..o+1 = input (o−1)/2..(o+1)/2
      return clamp({floor_div(o.a - 1, 2), floor_div(o.b, 2) + 1}, n_in);
    case Kind::kDown:  // 3×3 stride 2, no top/left padding: output o reads input 2o..2o+2
      return clamp({2 * o.a, 2 * o.b + 1}, n_in);
    case Kind::kResnet:
      return clamp({o.a - 2, o.b + 2}, n_in);
    default:
      return clamp({o.a - 1, o.b + 1}, n_in);
  }
}

class TiledChain {
 public:
  TiledChain(std::vector<Stage> stages, Tensor base, int64_t groups, double eps, const VaeTiling& tiling,
             const RunContext& ctx, const std::string& phase)
      : st_(std::move(stages)), base_(std::move(base)), groups_(groups), eps_(eps), keep_bytes_(tiling.keep_bytes),
        // Spilled tiles are written from host memory.
        spill_(tiling.spill && base_.device() == Device::kCpu), spill_dir_(tiling.spill_dir), ctx_(ctx), be_(ctx.be()),
        pool_(be_, 1.25), phase_(phase), a1_(st_.size()), a2_(st_.size()) {}

  // Runs the chain on tiles of `tile` pixels of the reference level (size `ref`, whose tile
  // borders map to whole pixels at every level) and returns the last stage's output, whole.
  Result<Tensor> run(Size2 ref, int64_t tile) {
    for (int64_t y = 0; y < ref.h; y += tile)
      for (int64_t x = 0; x < ref.w; x += tile) tiles_.push_back({{y, std::min(y + tile, ref.h)}, {x, std::min(x + tile, ref.w)}});
    ref_ = ref;
    int passes = 1, done = 0;
    for (const Stage& s : st_) passes += (s.kind == Kind::kResnet ? 2 : s.kind == Kind::kNormConv ? 1 : 0);
    for (size_t s = 0; s < st_.size(); ++s) {
      const Stage& S = st_[s];
      if (S.kind == Kind::kResnet || S.kind == Kind::kNormConv) {
        const Flux2Vae::Norm& n = S.kind == Kind::kResnet ? S.res->norm1 : *S.norm;
        KLEIN_ASSIGN_OR_RETURN(a1_[s], stats_pass(in_point(s), n));
        ctx_.report(phase_, ++done, passes);
      }
      if (S.kind == Kind::kResnet) {
        KLEIN_ASSIGN_OR_RETURN(a2_[s], stats_pass(in_point(s) + 1, S.res->norm2));
        ctx_.report(phase_, ++done, passes);
      }
    }
    const int last = out_point(st_.size() - 1);
    const Size2 n = size(last);
    KLEIN_ASSIGN_OR_RETURN(Tensor full, be_.alloc({1, channels(last), n.h, n.w}, "the tiled VAE output"));
    for (const Region& t : tiles_) {
      KLEIN_RETURN_IF_ERROR(ctx_.check_cancel("tiled VAE"));
      const Region c = core(last, t);
      KLEIN_ASSIGN_OR_RETURN(Tensor y, compute(last, c));
      KLEIN_RETURN_IF_ERROR(paste(y, c, full));
    }
    ctx_.report(phase_, ++done, passes);
    return full;
  }

 private:
  struct Affine {
    Tensor scale, shift;  // [C]
  };
  // A whole activation kept between passes: in memory (t) or spilled to a file (f).
  struct Kept {
    Tensor t;
    std::unique_ptr<ActivationSpill> f;
  };

  // Points of the chain: 0 = the base (stage 0's input); stage s: 2s+1 = a ResNet's hidden
  // tensor (after conv1), 2s+2 = its output.
  static int in_point(size_t s) { return static_cast<int>(2 * s); }
  static int out_point(size_t s) { return static_cast<int>(2 * s + 2); }
  Size2 size(int p) const { return p == 0 ? st_[0].in : (p % 2 ? st_[(p - 1) / 2].in : st_[(p - 2) / 2].out); }
  int64_t channels(int p) const {
    if (p == 0) return base_.dim(1);
    const Stage& s = st_[(p - 1) / 2];
    if (p % 2) return s.res->cout;
    return s.kind == Kind::kResnet ? s.res->cout : s.conv->w.shape[0];
  }
  // A tile's own part of point p's activation (the tiles' cores partition it).
  Region core(int p, const Region& t) const {
    const Size2 n = size(p);
    return {{t.y.a * n.h / ref_.h, t.y.b * n.h / ref_.h}, {t.x.a * n.w / ref_.w, t.x.b * n.w / ref_.w}};
  }

  // One pass over the tiles for the GroupNorm `n` of point p: its global affine. Keeps the whole
  // activation at p when it fits the budget (later passes then start there).
  Result<Affine> stats_pass(int p, const Flux2Vae::Norm& n) {
    GroupStats acc;
    const Size2 sz = size(p);
    const uint64_t bytes = static_cast<uint64_t>(channels(p) * sz.h * sz.w) * sizeof(float);
    const int first_needed = p % 2 ? p - 1 : p;  // a hidden point still needs its stage's input
    uint64_t kept_after = 0;
    for (const auto& [q, k] : kept_)
      if (q >= first_needed) kept_after += static_cast<uint64_t>(k.t.numel()) * sizeof(float);
    const bool fresh = p > 0 && !kept_.count(p);  // the base is whole already
    const bool keep = fresh && kept_after + bytes <= keep_bytes_;
    Kept kept;
    if (keep) {
      KLEIN_ASSIGN_OR_RETURN(kept.t, be_.alloc({1, channels(p), sz.h, sz.w}, "a kept VAE activation"));
    } else if (fresh && spill_) {
      KLEIN_ASSIGN_OR_RETURN(kept.f, ActivationSpill::create(channels(p), sz.h, sz.w, spill_dir_, "a spilled VAE activation"));
    }
    for (const Region& t : tiles_) {
      KLEIN_RETURN_IF_ERROR(ctx_.check_cancel("tiled VAE"));
      const Region c = core(p, t);
      if (c.y.len() <= 0 || c.x.len() <= 0) continue;
      KLEIN_ASSIGN_OR_RETURN(Tensor y, compute(p, c));
      KLEIN_RETURN_IF_ERROR(be_.group_norm_stats(y, groups_, acc));
      if (keep) KLEIN_RETURN_IF_ERROR(paste(y, c, kept.t));
      if (kept.f) KLEIN_RETURN_IF_ERROR(kept.f->write(y, c.y.a, c.x.a));
    }
    if (keep || kept.f) {
      for (auto it = kept_.begin(); it != kept_.end();) it = it->first < first_needed ? kept_.erase(it) : std::next(it);
      kept_.emplace(p, std::move(kept));
    }
    Affine a;
    KLEIN_ASSIGN_OR_RETURN(a.scale, be_.alloc({channels(p)}, "GroupNorm statistics"));
    KLEIN_ASSIGN_OR_RETURN(a.shift, be_.alloc({channels(p)}, "GroupNorm statistics"));
    KLEIN_RETURN_IF_ERROR(be_.group_norm_affine_from_stats(acc, n.w, n.b, eps_, a.scale, a.shift));
    return a;
  }

  // The activation at point p over exactly region R.
  Result<Tensor> compute(int p, const Region& R) {
    if (auto it = kept_.find(p); it != kept_.end()) return from_kept(it->second, p, R);
    if (p == 0) return crop(base_, {{0, base_.dim(2)}, {0, base_.dim(3)}}, R);
    const size_t s = static_cast<size_t>((p - 1) / 2);
    const Stage& S = st_[s];
    if (p % 2) {  // a ResNet's hidden tensor: conv1(silu(gn1(x)))
      KLEIN_ASSIGN_OR_RETURN(Tile x, input(s, grow(R, 1, S.in)));
      KLEIN_ASSIGN_OR_RETURN(Tile t, conv(x, S.res->conv1, Kind::kConv, S.in, &a1_[s]));
      return crop(t.t, t.r, R);
    }
    const Region need = {input_span(S.kind, R.y, S.in.h), input_span(S.kind, R.x, S.in.w)};
    KLEIN_ASSIGN_OR_RETURN(Tile x, input(s, need));
    switch (S.kind) {
      case Kind::kResnet: {
        const Region rt = grow(R, 1, S.in);
        Tensor t;
        if (auto it = kept_.find(p - 1); it != kept_.end()) {
          KLEIN_ASSIGN_OR_RETURN(t, from_kept(it->second, p - 1, rt));
        } else {
          KLEIN_ASSIGN_OR_RETURN(Tile tt, conv(x, S.res->conv1, Kind::kConv, S.in, &a1_[s]));
          KLEIN_ASSIGN_OR_RETURN(t, crop(tt.t, tt.r, rt));
        }
        // conv2's output region: rt less one pixel on each interior side (⊇ R where rt
        // reaches an image border on both sides of a narrow image).
        KLEIN_ASSIGN_OR_RETURN(ConvOptions o, options(Kind::kConv, rt, S.in, &a2_[s]));
        o.accumulate = true;  // the residual add
        const Region r2 = {{rt.y.a + 1 - o.pad_top, rt.y.b - 1 + o.pad_bottom},
                           {rt.x.a + 1 - o.pad_left, rt.x.b - 1 + o.pad_right}};
        KLEIN_ASSIGN_OR_RETURN(Tensor out, crop(x.t, x.r, r2));  // the identity shortcut
        if (!S.res->shortcut.w.empty()) {
          KLEIN_ASSIGN_OR_RETURN(Tile sc, conv(Tile{std::move(out), r2}, S.res->shortcut, Kind::kConv, S.in, nullptr, 1));
          out = std::move(sc.t);
        }
        x = Tile();
        KLEIN_RETURN_IF_ERROR(be_.conv2d(t, S.res->conv2.w, &S.res->conv2.b, out, o));
        return crop(out, r2, R);
      }
      case Kind::kNormConv: {
        KLEIN_ASSIGN_OR_RETURN(Tile y, conv(x, *S.conv, Kind::kConv, S.in, &a1_[s]));
        return crop(y.t, y.r, R);
      }
      default: {
        KLEIN_ASSIGN_OR_RETURN(Tile y, conv(x, *S.conv, S.kind, S.in, nullptr));
        return crop(y.t, y.r, R);
      }
    }
  }

  Result<Tensor> from_kept(const Kept& k, int p, const Region& R) {
    if (k.f) return k.f->read(R.y.a, R.y.b, R.x.a, R.x.b);
    return crop(k.t, {{0, size(p).h}, {0, size(p).w}}, R);
  }

  Result<Tile> input(size_t s, const Region& r) {
    KLEIN_ASSIGN_OR_RETURN(Tensor t, compute(in_point(s), r));
    return Tile{std::move(t), r};
  }

  // Padding of a whole-image conv of kind k, applied only on the sides where the tile (input
  // region r of an activation of size n) touches the image border.
  Result<ConvOptions> options(Kind k, const Region& r, Size2 n, const Affine* a) const {
    ConvOptions o;
    const bool top = r.y.a == 0, bottom = r.y.b == n.h, left = r.x.a == 0, right = r.x.b == n.w;
    if (k == Kind::kDown) {
      o.stride = 2;
      o.pad_bottom = bottom;
      o.pad_right = right;
    } else {
      o.pad_top = top;
      o.pad_bottom = bottom;
      o.pad_left = left;
      o.pad_right = right;
      o.upsample2x = k == Kind::kUp;
    }
    if (a) {
      o.in_scale = a->scale;
      o.in_shift = a->shift;
      o.in_silu = true;
    }
    return o;
  }

  // A conv of kind k (3×3 same, nearest-×2 + 3×3, or 3×3 stride 2; ksize 1: the 1×1 shortcut)
  // on a tile; the output region follows from the padding used.
  Result<Tile> conv(const Tile& x, const Flux2Vae::Conv& c, Kind k, Size2 n, const Affine* a, int ksize = 3) {
    ConvOptions o;
    if (ksize == 3) {
      KLEIN_ASSIGN_OR_RETURN(o, options(k, x.r, n, a));
    }
    const int64_t OH = conv_out_size(x.t.dim(2), c.w.shape[2], o.stride, o.pad_top, o.pad_bottom, o.upsample2x);
    const int64_t OW = conv_out_size(x.t.dim(3), c.w.shape[3], o.stride, o.pad_left, o.pad_right, o.upsample2x);
    auto origin = [&](int64_t a0, int pad) {
      if (ksize == 1) return a0;
      if (k == Kind::kDown) return a0 / 2;
      return (k == Kind::kUp ? 2 * a0 : a0) + 1 - pad;
    };
    Region r = {{origin(x.r.y.a, o.pad_top), 0}, {origin(x.r.x.a, o.pad_left), 0}};
    r.y.b = r.y.a + OH;
    r.x.b = r.x.a + OW;
    // From the pool: the conv does not accumulate, so it writes every value.
    KLEIN_ASSIGN_OR_RETURN(Tensor y, pool_.take({1, c.w.shape[0], OH, OW}, "VAE tile activations (" + c.w.name + ")"));
    KLEIN_RETURN_IF_ERROR(be_.conv2d(x.t, c.w, &c.b, y, o));
    return Tile{std::move(y), r};
  }

  // The part R of t (which holds region `have`), as its own tensor.
  Result<Tensor> crop(const Tensor& t, const Region& have, const Region& R) {
    if (R.y.a < have.y.a || R.y.b > have.y.b || R.x.a < have.x.a || R.x.b > have.x.b)
      return internal_error("tiled VAE: a tile region is outside what was computed");
    const int64_t C = t.dim(1), H = t.dim(2), W = t.dim(3), h = R.y.len(), w = R.x.len();
    KLEIN_ASSIGN_OR_RETURN(Tensor out, pool_.take({1, C, h, w}, "a VAE tile"));  // every value copied below
    const int64_t dy = R.y.a - have.y.a, dx = R.x.a - have.x.a;
    const TensorView src = t.view().reshaped({C * H, W}), dst = out.view().reshaped({C * h, w});
    for (int64_t c = 0; c < C; ++c)
      KLEIN_RETURN_IF_ERROR(be_.copy(src.row_range(c * H + dy, c * H + dy + h).col_range(dx, dx + w),
                                     dst.row_range(c * h, (c + 1) * h)));
    return out;
  }

  // Writes tile y (region R) into the whole activation `full`.
  Status paste(const Tensor& y, const Region& R, const Tensor& full) {
    const int64_t C = y.dim(1), h = y.dim(2), w = y.dim(3), H = full.dim(2), W = full.dim(3);
    const TensorView src = y.view().reshaped({C * h, w}), dst = full.view().reshaped({C * H, W});
    for (int64_t c = 0; c < C; ++c)
      KLEIN_RETURN_IF_ERROR(be_.copy(src.row_range(c * h, (c + 1) * h),
                                     dst.row_range(c * H + R.y.a, c * H + R.y.b).col_range(R.x.a, R.x.b)));
    return Status::Ok();
  }

  std::vector<Stage> st_;
  Tensor base_;
  int64_t groups_;
  double eps_;
  uint64_t keep_bytes_;
  bool spill_;
  std::string spill_dir_;
  const RunContext& ctx_;
  Backend& be_;
  // The tiles' activations (conv outputs, crops): each tile reuses the last one's pages. Close
  // fits only (BufferPool's max_fit): tiling is how a memory budget is kept.
  BufferPool pool_;
  std::string phase_;
  std::vector<Affine> a1_, a2_;  // per stage: the norm on its input; a ResNet's norm2
  std::map<int, Kept> kept_;     // point → whole activation
  std::vector<Region> tiles_;    // at the reference level
  Size2 ref_;
};

}  // namespace

int64_t Flux2Vae::tile_size(int64_t H, int64_t W, const VaeTiling& t, bool decoder) const {
  const int64_t f = cfg_.scale_factor();
  auto rounded = [&](int64_t n) { return std::max(f, n / f * f); };
  if (t.tile > 0) return rounded(t.tile);
  if (t.tile < 0) return 0;
  // The whole-image pass holds about three activations of its widest full-resolution block:
  // decoder block i runs at image/2^(n−1−i), encoder block i at image/2^i.
  const auto& ch = decoder ? cfg_.decoder_block_out_channels : cfg_.block_out_channels;
  const int64_t nb = static_cast<int64_t>(ch.size());
  uint64_t widest = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const int64_t k = decoder ? nb - 1 - i : i;  // channel index and level of the block
    const int64_t c = std::max(ch[k], ch[decoder ? std::min(k + 1, nb - 1) : std::max<int64_t>(k - 1, 0)]);
    const int64_t level = int64_t{1} << (decoder ? nb - 1 - i : i);
    widest = std::max(widest, static_cast<uint64_t>(c * (H / level) * (W / level)));
  }
  return 3 * widest * sizeof(float) > t.auto_above_bytes ? rounded(t.auto_tile) : 0;
}

Result<Tensor> Flux2Vae::decode_tiled(Tensor mid, int64_t tile, const VaeTiling& tiling, const RunContext& ctx) const {
  // The up blocks and conv_norm_out + conv_out, tiled at the output resolution.
  std::vector<Stage> stages;
  Size2 n = {mid.dim(2), mid.dim(3)};
  for (const Block& b : dec_blocks_) {
    for (const Resnet& r : b.resnets) stages.push_back({Kind::kResnet, &r, nullptr, nullptr, n, n});
    if (b.has_sampler) {
      stages.push_back({Kind::kUp, nullptr, &b.sampler, nullptr, n, {2 * n.h, 2 * n.w}});
      n = {2 * n.h, 2 * n.w};
    }
  }
  stages.push_back({Kind::kNormConv, nullptr, &dec_conv_out_, &dec_norm_out_, n, n});
  TiledChain chain(std::move(stages), std::move(mid), cfg_.norm_num_groups, cfg_.norm_eps, tiling, ctx,
                   "decode");
  return chain.run(n, tile);
}

Result<Tensor> Flux2Vae::encode_tiled(Tensor image, int64_t tile, const VaeTiling& tiling, const RunContext& ctx) const {
  // conv_in and the down blocks, tiled at the image resolution.
  std::vector<Stage> stages;
  const Size2 full = {image.dim(2), image.dim(3)};
  Size2 n = full;
  stages.push_back({Kind::kConv, nullptr, &enc_conv_in_, nullptr, n, n});
  for (const Block& b : enc_blocks_) {
    for (const Resnet& r : b.resnets) stages.push_back({Kind::kResnet, &r, nullptr, nullptr, n, n});
    if (b.has_sampler) {
      stages.push_back({Kind::kDown, nullptr, &b.sampler, nullptr, n, {n.h / 2, n.w / 2}});
      n = {n.h / 2, n.w / 2};
    }
  }
  TiledChain chain(std::move(stages), std::move(image), cfg_.norm_num_groups, cfg_.norm_eps, tiling, ctx,
                   "vae_encode");
  return chain.run(full, tile);
}

}  // namespace klein
