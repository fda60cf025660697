// Models: the networks a rank trains, behind one small interface so the
// training loop, gradient bucketing and checkpoints treat built-in torch::nn
// models and user TorchScript models alike.
//
// Callers: the rank process builds one with CreateModel from the job spec's
// model section, moves it to its device, hands Parameters() to the optimizer
// and the gradient synchroniser, and saves/loads it for checkpoints.
//
//   "mlp"         Linear layers with ReLU between them. Empty hidden_sizes is
//                 the classic DDP example's single Linear(5 -> 2).
//   "cnn"         for [N, 1, 28, 28] images (Fashion-MNIST): two blocks of
//                 conv3x3 (+ optional batch norm) + ReLU + 2x2 max-pool, then
//                 Linear -> ReLU -> Linear to the classes.
//   "torchscript" a module the user saved from Python with
//                 torch.jit.script(m).save(path) / torch.jit.trace; its
//                 parameters are trained in place and Save writes it back in
//                 the same format, so Python can torch.jit.load the result.
//
// Two ways out: Save() writes the engine's own checkpoint format (LibTorch's
// torch::serialize archive for built-ins, the TorchScript file itself for
// "torchscript"), which Load() reads back. ExportTorchScript() writes a
// self-contained TorchScript module for inference from Python:
//   m = torch.jit.load(path); m.eval(); y = m(x)
// For built-ins it builds a torch::jit::Module, registers the trained
// parameters and buffers (dots in names become underscores, e.g.
// "layers_0_weight"), and define()s a TorchScript forward equivalent to the
// C++ one in eval mode (batch norm uses its running statistics).
//
// Threading: a Model is not thread-safe; it belongs to the rank's training
// thread (autograd may run its own threads during backward, as in PyTorch).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainctl::engine {

struct MlpOptions {
  int64_t input_dim = 5;              // features per sample, >= 1
  std::vector<int64_t> hidden_sizes;  // each >= 1; empty = one Linear layer
  int64_t output_dim = 2;             // classes (or regression outputs), >= 1
};

struct CnnOptions {
  int64_t in_channels = 1;      // >= 1
  int64_t image_size = 28;      // square input side, >= 4
  int64_t conv1_channels = 32;  // >= 1
  int64_t conv2_channels = 64;  // >= 1
  int64_t hidden = 128;         // fully connected width, >= 1
  int64_t classes = 10;         // >= 1
  bool batch_norm = false;      // BatchNorm2d after each convolution
};

struct TorchScriptModelOptions {
  std::string path;  // a file written by torch.jit.save / ScriptModule.save
};

struct ModelOptions {
  std::string name;  // "mlp", "cnn" or "torchscript"; selects the struct used below
  MlpOptions mlp;
  CnnOptions cnn;
  TorchScriptModelOptions torchscript;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class Model {
 public:
  virtual ~Model() = default;

  virtual const std::string& name() const = 0;

  // Runs forward. InvalidArgument (with LibTorch's message) when the input
  // does not fit the model, e.g. a wrong shape for a TorchScript module.
  virtual absl::StatusOr<at::Tensor> Forward(const at::Tensor& input) = 0;

  // Trainable parameters in registration order (what optimizers and the
  // gradient bucketer take); names are dotted paths like "layers.0.weight".
  virtual std::vector<at::Tensor> Parameters() = 0;
  virtual NamedTensors NamedParameters() = 0;
  // Non-trainable state (batch-norm running stats): broadcast from rank 0 and
  // checkpointed with the parameters.
  virtual NamedTensors NamedBuffers() = 0;

  virtual void SetTraining(bool training) = 0;
  virtual absl::Status To(const c10::Device& device) = 0;

  // Writes the model to `path` atomically (temp file + rename).
  virtual absl::Status Save(const std::string& path) = 0;
  // Writes an inference module Python can torch.jit.load, atomically.
  virtual absl::Status ExportTorchScript(const std::string& path) = 0;
  // Copies parameters and buffers from a file written by Save (or, for
  // TorchScript, any compatible module) into this model in place, so tensors
  // held by an optimizer stay valid. NotFound / InvalidArgument on failure.
  virtual absl::Status Load(const std::string& path) = 0;
};

// InvalidArgument naming the field for an unknown model name or bad sizes;
// NotFound / InvalidArgument for a missing or unloadable TorchScript file.
absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelOptions& options);

}  // namespace trainctl::engine
