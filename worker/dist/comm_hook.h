// DDP communication hooks: what the GradientBucketer does to a bucket of
// float32 gradients around its all-reduce, as the built-in hooks of
// torch.distributed.algorithms.ddp_comm_hooks.default_hooks do.
//
// - kNone: PyTorch's default. The gradients are divided by world size while
//   they are copied into the bucket, and the float32 bucket is summed.
// - kFp16Compress / kBf16Compress (fp16_compress_hook / bf16_compress_hook):
//   the bucket holds the raw gradients (a registered hook makes PyTorch's
//   reducer skip its division); CompressBucket casts it to float16 / bfloat16
//   and divides by world size in that type, the 16-bit buffer is summed, and
//   DecompressBucket casts the result back into the float32 bucket. Half the
//   bytes travel; the gradient carries 16-bit rounding (docs/ddp.md).
// - kPowerSgd (powerSGD_hook): the bucket holds the raw gradients; matrices
//   travel as low-rank factors P and Q (powersgd.h), the rest as float32.
//
// Called by gradient_bucketer.cc; the functions are free so that a unit test
// can pin their arithmetic. Not thread-safe per bucket (the bucketer holds
// its mutex).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace at {
class Tensor;
}  // namespace at

namespace trainctl::dist {

enum class CommHook {
  kNone,          // float32 all-reduce of the averaged gradients
  kFp16Compress,  // float16 on the wire (PyTorch's fp16_compress_hook)
  kBf16Compress,  // bfloat16 on the wire (PyTorch's bf16_compress_hook)
  kPowerSgd,      // low-rank factors on the wire (PyTorch's powerSGD_hook)
};

// The job spec's names: "none", "fp16_compress", "bf16_compress", "powersgd".
const char* CommHookName(CommHook hook);
// InvalidArgument naming the choices for anything else.
absl::StatusOr<CommHook> ParseCommHook(std::string_view name);

// True for every hook: the bucket then holds the raw (undivided) gradients
// and the hook divides by world size (PyTorch's reducer leaves the division
// to a registered hook).
inline bool Compresses(CommHook hook) { return hook != CommHook::kNone; }

// True when the hook sends a 16-bit copy of the bucket.
inline bool CastsTo16Bits(CommHook hook) {
  return hook == CommHook::kFp16Compress || hook == CommHook::kBf16Compress;
}

// Allocates the 16-bit buffer that carries `flat` (a float32 bucket) for
// `hook`, on flat's device. Only for a hook that CastsTo16Bits().
at::Tensor NewCompressedBuffer(const at::Tensor& flat, CommHook hook);

// compressed = cast(flat) / world_size, in compressed's dtype (the hook's
// `buffer.to(torch.float16).div_(world_size)`).
void CompressBucket(const at::Tensor& flat, int world_size, at::Tensor& compressed);

// flat = float32(compressed) (the hook's decompress: `buffer.copy_(fut.value())`).
void DecompressBucket(const at::Tensor& compressed, at::Tensor& flat);

}  // namespace trainctl::dist
