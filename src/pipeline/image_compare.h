// Image similarity for `klein compare`: PSNR, SSIM and correlation of two 8-bit RGB images.
#pragma once

#include "core/status.h"
#include "klein/klein.h"

namespace klein {

// PSNR over all R, G, B values (peak 255); SSIM as Wang et al. 2004 (Gaussian 11x11 window,
// sigma 1.5, K1 0.01, K2 0.03, L 255) on BT.601 luma (0.299 R + 0.587 G + 0.114 B), averaged over
// the positions where the window fits (images of at least 11x11); Pearson correlation of all
// R, G, B values. All in double precision.
Result<ImageComparison> compare_rgb(const Image& a, const Image& b);

// Cosine, relative L2 (to a) and max difference of two arrays of one shape; non-finite values
// are an error (named with the first index), not a NaN result.
Result<ArrayComparison> compare_float_arrays(const FloatArray& a, const FloatArray& b);

}  // namespace klein
