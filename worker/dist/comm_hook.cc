#include "worker/dist/comm_hook.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <c10/core/GradMode.h>

#include "absl/strings/str_cat.h"

namespace trainctl::dist {

const char* CommHookName(CommHook hook) {
  switch (hook) {
    case CommHook::kNone:
      return "none";
    case CommHook::kFp16Compress:
      return "fp16_compress";
    case CommHook::kBf16Compress:
      return "bf16_compress";
    case CommHook::kPowerSgd:
      return "powersgd";
  }
  return "?";
}

absl::StatusOr<CommHook> ParseCommHook(std::string_view name) {
  for (CommHook h :
       {CommHook::kNone, CommHook::kFp16Compress, CommHook::kBf16Compress, CommHook::kPowerSgd}) {
    if (name == CommHookName(h)) return h;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("comm_hook: must be one of none, fp16_compress, bf16_compress, powersgd, got '",
                   std::string(name), "'"));
}

at::Tensor NewCompressedBuffer(const at::Tensor& flat, CommHook hook) {
  const at::ScalarType type = hook == CommHook::kFp16Compress ? at::kHalf : at::kBFloat16;
  return at::zeros(flat.sizes(), flat.options().dtype(type).requires_grad(false));
}

void CompressBucket(const at::Tensor& flat, int world_size, at::Tensor& compressed) {
  c10::NoGradGuard no_grad;
  compressed.copy_(flat);
  // Divided in the 16-bit type after the cast, as the PyTorch hook does
  // (the order matters for the rounding).
  at::Tensor divisor = c10::scalar_to_tensor(c10::Scalar(static_cast<int64_t>(world_size)));
  divisor.unsafeGetTensorImpl()->set_wrapped_number(true);
  compressed.div_(divisor);
}

void DecompressBucket(const at::Tensor& compressed, at::Tensor& flat) {
  c10::NoGradGuard no_grad;
  flat.copy_(compressed);
}

}  // namespace trainctl::dist
