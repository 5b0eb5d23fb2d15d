// TEMPORARY until the registry lands (merge of branch kernels): forwards to the old dispatch.
#include "kernels/registry.h"
#include "kernels/kernels.h"
namespace klein::kernels {
KernelSet KernelSet::select(const CpuFeatures&, Isa) { return KernelSet(); }
std::string KernelSet::describe() const { return ""; }
const CpuFeatures& dummy();
}  // namespace klein::kernels
namespace klein {
const CpuFeatures& CpuFeatures::host() { static CpuFeatures f; return f; }
}
namespace klein::kernels {
void run_linear(const KernelSet&, const float* x, int64_t M, int64_t K, const Weight& W, const Weight* bias,
                float* y, ThreadPool& pool, int64_t ldx, int64_t ldy) { linear(x, M, K, W, bias, y, pool, ldx, ldy); }
void run_attention(const KernelSet&, const float* q, const float* k, const float* v, float* out, int64_t Sq,
                   int64_t Sk, int Hq, int Hkv, int D, float scale, const AttnMask& mask, ThreadPool& pool,
                   int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo) { attention(q,k,v,out,Sq,Sk,Hq,Hkv,D,scale,mask,pool,ldq,ldk,ldv,ldo); }
void run_conv2d(const KernelSet&, const float* in, int64_t N, int64_t Cin, int64_t H, int64_t W, const Weight& w,
                const Weight* bias, float* out, const Conv2dParams& p, ThreadPool& pool) { conv2d(in,N,Cin,H,W,w,bias,out,p,pool); }
}
