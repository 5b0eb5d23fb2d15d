// AMX tile set-up shared by the AMX kernels (gemm_amx.cpp, attention_amx.cpp): every kernel uses
// palette 1 with all 8 tiles at their largest, 16 rows × 64 bytes, so one configuration serves
// all of them. The configuration is per thread; the OS permission for the tile state is asked
// once per process by CpuFeatures::host(), which reports AMX only when it was granted.
//
// Include ONLY from *_amx.cpp files (compiled with -mamx-*), which only the kernel registry
// reaches, on CPUs that have the ISA.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace klein::kernels {
namespace {

// The 64-byte ldtilecfg operand: palette 1, all 8 tiles 16 rows × 64 bytes.
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  AmxTileConfig() {
    for (int t = 0; t < 8; ++t) colsb[t] = 64, rows[t] = 16;
  }
};

// Loads the configuration into this thread's tile state (cheap next to any tile product loop;
// called at the start of each kernel's per-thread work rather than tracked per thread).
inline void amx_configure_tiles() {
  static const AmxTileConfig cfg;
  _tile_loadconfig(&cfg);
}

}  // namespace
}  // namespace klein::kernels
