// Which keys a query may attend to: shared by the Backend interface and the attention kernels.
#pragma once

#include <cstdint>

namespace klein {

// A key j is visible to query i iff
//   (!causal || j <= i)  &&  (key_valid == nullptr || key_valid[j] != 0).
struct AttnMask {
  bool causal = false;
  const uint8_t* key_valid = nullptr;  // [Sk] host bytes, or null

  // The first key that key_valid lets through (Sk: none). Query i sees some key iff
  // first_key(Sk) < Sk && (!causal || first_key(Sk) <= i): the mask's own answer, for the
  // kernels to give such a row zeros while one whose visible scores are all -inf (0/0) is NaN.
  int64_t first_key(int64_t Sk) const {
    int64_t j = 0;
    if (key_valid)
      while (j < Sk && key_valid[j] == 0) ++j;
    return j;
  }
};

}  // namespace klein
