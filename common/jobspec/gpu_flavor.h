// GPU flavors: the name of a GPU model that workers label their GPU slots
// with and jobs ask for (resources.gpu_flavor), as Kueue's ResourceFlavors
// and Slurm's GRES types (`--gres=gpu:h100:2`). One rule for the name,
// read by the worker daemon (--gpu-flavor), the job spec validator and the
// coordinator, so they cannot disagree.
#pragma once

#include <string>
#include <string_view>

namespace trainctl {

// The longest flavor name (a DNS label's bound, as Kubernetes names).
inline constexpr size_t kMaxGpuFlavorLength = 63;

// Empty when `flavor` is a valid flavor name: 1 to 63 characters among
// lowercase letters, digits, '.', '_' and '-', starting with a letter or a
// digit. Otherwise why not, in words (without the field's name).
std::string GpuFlavorProblem(std::string_view flavor);

// The flavor a GPU of this (NVML / CUDA) name gets by default. The rule:
//   1. lowercase the name and split it into words at spaces, '-' and '_';
//   2. drop the vendor and brand words: nvidia, tesla, geforce, quadro;
//   3. the flavor is the first word left, joined with the next one when
//      it is "rtx" or "gtx" (the model number follows: "rtx 4090");
//   4. keep only letters, digits and '.' of it, at most 63 characters.
// So the form factor, memory size and memory kind that follow the model
// are dropped: "NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA A100-SXM4-80GB"
// -> "a100", "Tesla V100-SXM2-16GB" -> "v100", "NVIDIA GeForce RTX 4090"
// -> "rtx4090", "NVIDIA L40S" -> "l40s". A name with no word left (empty,
// or only brand words) gives "": the GPU has no flavor, and only jobs
// that ask for none run on it. An operator who wants another split (the
// 40GB and 80GB A100s apart) names the flavor with --gpu-flavor.
std::string NormalizeGpuFlavor(std::string_view gpu_name);

}  // namespace trainctl
