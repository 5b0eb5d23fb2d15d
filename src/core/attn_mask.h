// Which keys a query may attend to: shared by the Backend interface and the attention kernels.
#pragma once

#include <cstdint>

namespace klein {

// A key j is visible to query i iff
//   (!causal || j <= i)  &&  (key_valid == nullptr || key_valid[j] != 0).
struct AttnMask {
  bool causal = false;
  const uint8_t* key_valid = nullptr;  // [Sk] host bytes, or null
};

}  // namespace klein
