// What Flux2KleinPipeline.__call__ does to each reference image before the VAE
// (diffusers 0.42.1 pipeline_flux2_klein.py:760-782, pipelines/flux2/image_processor.py,
// image_processor.py VaeImageProcessor.preprocess), bit-exactly for an image that came through
// load_image (i.e. already RGB, see io/image_reader.h):
//   1. check_image_input: width and height >= 64, max(w/h, h/w) <= 8, else ValueError.
//   2. if w*h > 1024*1024: _resize_to_target_area: s = sqrt(1048576 / (w*h)) (double),
//      w' = int(w*s), h' = int(h*s) (truncation), img.resize((w', h'), LANCZOS) -- Pillow's
//      ImagingResample (reducing_gap None, box = whole image) ported here bit-exactly.
//   3. w16 = w' // 16 * 16, h16 = h' // 16 * 16.
//   4. preprocess(img, h16, w16, resize_mode="crop"): a pure centre crop (no rescale):
//      left = (w' - w16) // 2, top = (h' - h16) // 2; convert("RGB") (no-op); then
//      x = float32(u) / 255.0f; x = 2.0f * x - 1.0f (numpy float32 division, then torch's two
//      float32 ops), HWC -> [1, 3, h16, w16].
//   5. If height/width are not given, the pipeline uses the FIRST reference's (h16, w16), each
//      of the two independently (`height = height or image_height`, same for width).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/image_reader.h"

namespace klein {

struct ReferenceGeometry {
  int in_width = 0, in_height = 0;            // the decoded image
  bool resized = false;                       // step 2 applied
  int resized_width = 0, resized_height = 0;  // after step 2 (== input when not resized)
  int crop_left = 0, crop_top = 0;            // step 4 crop origin in the resized image
  int width = 0, height = 0;                  // the tensor's size: multiples of 16
};

// Steps 1-3 on sizes only. Errors (too small / aspect ratio) name `name` and carry diffusers'
// wording, e.g. "ref.png: Image too small: 32×48. Both dimensions must be at least 64px".
Result<ReferenceGeometry> plan_reference(int width, int height, const std::string& name);

// Steps 1-4: the float32 [1, 3, H, W] tensor in [-1, 1] that the pipeline hands to the VAE.
// If `geometry` is given it receives the plan.
Result<Tensor> preprocess_reference(const Image& image, const std::string& name,
                                    ReferenceGeometry* geometry = nullptr);

// Pillow's Image.resize(size, Resampling.LANCZOS) for an 8-bit RGB image (reducing_gap None,
// box the whole image): ImagingResample with Lanczos a=3, double coefficients normalised per
// output pixel, then 22-bit fixed point (PRECISION_BITS = 32-8-2), horizontal pass then vertical
// pass, each only when that dimension changes. Bit-exact with Pillow 13 (same libm sin()).
Image resize_lanczos(const Image& image, int width, int height);

// Step 5: the output (width, height) from the optional user values and the planned references
// (a value <= 0 counts as absent, like Python's `height or ...`); without references or values,
// 1024 x 1024 (default_sample_size 128 * vae_scale_factor 8).
std::pair<int, int> resolve_output_size(std::optional<int> width, std::optional<int> height,
                                        const std::vector<ReferenceGeometry>& references);

}  // namespace klein
