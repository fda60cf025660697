#include "worker/engine/model.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <ostream>
#include <utility>

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safe_file.h"
#include "common/status_macros.h"
#include "worker/engine/engine_errors.h"

namespace trainctl::engine {
namespace {

absl::Status CheckReadable(const std::string& path, const char* what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(what, " '", path, "' does not exist"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' is not a regular file"));
  }
  return absl::OkStatus();
}

// Runs `write(stream)` into a new file created beside `path` without
// following links (common/safe_file.h: the checkpoint directory is the job's,
// a link planted at "model.pt.tmp" must not turn a victim file into a
// model), then renames it over `path`, so a crash never leaves a
// half-written model behind. LibTorch gets a stream, never a path.
template <typename WriteFn>
absl::Status SaveAtomically(const std::string& path, WriteFn write) {
  absl::StatusOr<std::unique_ptr<SafeFileWriter>> file = SafeFileWriter::Create(path);
  if (!file.ok()) return file.status();
  try {
    write((*file)->stream());
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("saving model to '", path, "' failed: ", FirstLine(e.what())));
  }
  return (*file)->Commit();
}

// Copies every tensor of `src` into the same-named tensor of `dst` in place.
absl::Status CopyNamed(const NamedTensors& dst, const NamedTensors& src, const std::string& path) {
  std::map<std::string, at::Tensor> by_name(src.begin(), src.end());
  torch::NoGradGuard no_grad;
  for (const auto& [name, tensor] : dst) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model file '", path, "' has no tensor '", name, "'"));
    }
    if (!it->second.sizes().equals(tensor.sizes())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model file '", path, "': tensor '", name, "' has shape ", c10::str(it->second.sizes()),
          ", the model expects ", c10::str(tensor.sizes())));
    }
    at::Tensor(tensor).copy_(it->second);
  }
  return absl::OkStatus();
}

NamedTensors ToVector(const torch::OrderedDict<std::string, torch::Tensor>& dict) {
  NamedTensors out;
  for (const auto& item : dict) out.emplace_back(item.key(), item.value());
  return out;
}

// ---------------------------------------------------------------- built-ins

class MlpNet : public torch::nn::Module {
 public:
  explicit MlpNet(const MlpOptions& o) {
    torch::nn::Sequential layers;
    int64_t in = o.input_dim;
    for (int64_t h : o.hidden_sizes) {
      layers->push_back(torch::nn::Linear(in, h));
      layers->push_back(torch::nn::ReLU());
      in = h;
    }
    layers->push_back(torch::nn::Linear(in, o.output_dim));
    layers_ = register_module("layers", layers);
  }
  torch::Tensor forward(const torch::Tensor& x) { return layers_->forward(x); }

  // TorchScript equivalent of forward() over the flattened parameter names.
  std::string ScriptSource() const {
    std::string src = "def forward(self, x):\n";
    const size_t n = layers_->size();
    for (size_t i = 0; i < n; i += 2) {
      absl::StrAppend(&src, "    x = torch.linear(x, self.layers_", i, "_weight, self.layers_", i,
                      "_bias)\n");
      if (i + 1 < n) absl::StrAppend(&src, "    x = torch.relu(x)\n");
    }
    absl::StrAppend(&src, "    return x\n");
    return src;
  }

 private:
  torch::nn::Sequential layers_{nullptr};
};

class CnnNet : public torch::nn::Module {
 public:
  explicit CnnNet(const CnnOptions& o) : batch_norm_(o.batch_norm) {
    conv1_ = register_module(
        "conv1",
        torch::nn::Conv2d(torch::nn::Conv2dOptions(o.in_channels, o.conv1_channels, 3).padding(1)));
    conv2_ = register_module(
        "conv2", torch::nn::Conv2d(
                     torch::nn::Conv2dOptions(o.conv1_channels, o.conv2_channels, 3).padding(1)));
    if (batch_norm_) {
      bn1_ = register_module("bn1", torch::nn::BatchNorm2d(o.conv1_channels));
      bn2_ = register_module("bn2", torch::nn::BatchNorm2d(o.conv2_channels));
    }
    const int64_t side = (o.image_size / 2) / 2;
    fc1_ = register_module("fc1", torch::nn::Linear(o.conv2_channels * side * side, o.hidden));
    fc2_ = register_module("fc2", torch::nn::Linear(o.hidden, o.classes));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = conv1_->forward(x);
    if (batch_norm_) x = bn1_->forward(x);
    x = torch::max_pool2d(torch::relu(x), 2);
    x = conv2_->forward(x);
    if (batch_norm_) x = bn2_->forward(x);
    x = torch::max_pool2d(torch::relu(x), 2);
    x = torch::relu(fc1_->forward(x.flatten(1)));
    return fc2_->forward(x);
  }

  // TorchScript equivalent of forward() in eval mode.
  std::string ScriptSource() const {
    auto block = [this](int k) {
      std::string s = absl::StrCat("    x = torch.conv2d(x, self.conv", k, "_weight, self.conv", k,
                                   "_bias, [1, 1], [1, 1])\n");
      if (batch_norm_) {
        absl::StrAppend(&s, "    x = torch.batch_norm(x, self.bn", k, "_weight, self.bn", k,
                        "_bias, self.bn", k, "_running_mean, self.bn", k,
                        "_running_var, False, 0.1, 1e-05, False)\n");
      }
      absl::StrAppend(&s, "    x = torch.max_pool2d(torch.relu(x), [2, 2])\n");
      return s;
    };
    return absl::StrCat("def forward(self, x):\n", block(1), block(2),
                        "    x = torch.relu(torch.linear(torch.flatten(x, 1), self.fc1_weight, "
                        "self.fc1_bias))\n",
                        "    return torch.linear(x, self.fc2_weight, self.fc2_bias)\n");
  }

 private:
  bool batch_norm_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};

// Wraps a torch::nn::Module subclass with forward(Tensor). `make` builds a
// fresh module of the same architecture (Load reads into one, then copies).
template <typename Net, typename NetOptions>
class NnModel final : public Model {
 public:
  NnModel(std::string name, NetOptions options)
      : name_(std::move(name)),
        options_(std::move(options)),
        net_(std::make_shared<Net>(options_)) {}

  const std::string& name() const override { return name_; }

  absl::StatusOr<at::Tensor> Forward(const at::Tensor& input) override {
    try {
      return net_->forward(input);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, " forward failed: ", FirstLine(e.what())));
    }
  }
  std::vector<at::Tensor> Parameters() override { return net_->parameters(); }
  NamedTensors NamedParameters() override { return ToVector(net_->named_parameters()); }
  NamedTensors NamedBuffers() override { return ToVector(net_->named_buffers()); }
  void SetTraining(bool training) override { net_->train(training); }
  absl::Status To(const c10::Device& device) override {
    try {
      net_->to(device);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("moving ", name_, " to ", device.str(), " failed: ", FirstLine(e.what())));
    }
    return absl::OkStatus();
  }
  absl::Status Save(const std::string& path) override {
    return SaveAtomically(path, [this](std::ostream& out) {
      torch::serialize::OutputArchive archive;
      net_->save(archive);
      archive.save_to(out);
    });
  }
  absl::Status ExportTorchScript(const std::string& path) override {
    return SaveAtomically(path, [this](std::ostream& stream) {
      torch::NoGradGuard no_grad;
      torch::jit::Module out(absl::StrCat("trainctl.", name_));
      auto flat = [](std::string name) {
        for (char& c : name) c = c == '.' ? '_' : c;
        return name;
      };
      for (const auto& item : net_->named_parameters()) {
        out.register_parameter(flat(item.key()), item.value().detach().clone(), false);
      }
      for (const auto& item : net_->named_buffers()) {
        out.register_buffer(flat(item.key()), item.value().detach().clone());
      }
      out.define(net_->ScriptSource());
      out.eval();
      out.save(stream);
    });
  }
  absl::Status Load(const std::string& path) override {
    TRAINCTL_RETURN_IF_ERROR(CheckReadable(path, "model file"));
    auto fresh = std::make_shared<Net>(options_);
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(path);
      fresh->load(archive);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("model file '", path, "' does not hold a ",
                                                     name_,
                                                     " of this shape: ", FirstLine(e.what())));
    }
    TRAINCTL_RETURN_IF_ERROR(
        CopyNamed(NamedParameters(), ToVector(fresh->named_parameters()), path));
    return CopyNamed(NamedBuffers(), ToVector(fresh->named_buffers()), path);
  }

 private:
  const std::string name_;
  const NetOptions options_;
  std::shared_ptr<Net> net_;
};

// -------------------------------------------------------------- TorchScript

absl::StatusOr<torch::jit::Module> LoadScript(const std::string& path) {
  TRAINCTL_RETURN_IF_ERROR(CheckReadable(path, "TorchScript file"));
  try {
    return torch::jit::load(path, torch::kCPU);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("TorchScript file '", path, "' cannot be loaded: ", FirstLine(e.what())));
  }
}

NamedTensors ScriptNamed(const torch::jit::named_parameter_list& list) {
  NamedTensors out;
  for (const auto& item : list) out.emplace_back(item.name, item.value);
  return out;
}
NamedTensors ScriptNamed(const torch::jit::named_buffer_list& list) {
  NamedTensors out;
  for (const auto& item : list) out.emplace_back(item.name, item.value);
  return out;
}

class ScriptModel final : public Model {
 public:
  explicit ScriptModel(torch::jit::Module module) : module_(std::move(module)) {}

  const std::string& name() const override { return name_; }

  absl::StatusOr<at::Tensor> Forward(const at::Tensor& input) override {
    c10::IValue out;
    try {
      out = module_.forward({input});
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("torchscript forward failed: ", FirstLine(e.what())));
    }
    if (!out.isTensor()) {
      return absl::InvalidArgumentError(
          absl::StrCat("torchscript forward returned a ", out.tagKind(), ", expected a tensor"));
    }
    return out.toTensor();
  }
  std::vector<at::Tensor> Parameters() override {
    std::vector<at::Tensor> out;
    for (const at::Tensor& p : module_.parameters()) out.push_back(p);
    return out;
  }
  NamedTensors NamedParameters() override { return ScriptNamed(module_.named_parameters()); }
  NamedTensors NamedBuffers() override { return ScriptNamed(module_.named_buffers()); }
  void SetTraining(bool training) override { module_.train(training); }
  absl::Status To(const c10::Device& device) override {
    try {
      module_.to(device);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("moving torchscript model to ", device.str(),
                                                     " failed: ", FirstLine(e.what())));
    }
    return absl::OkStatus();
  }
  absl::Status Save(const std::string& path) override {
    return SaveAtomically(path, [this](std::ostream& out) { module_.save(out); });
  }
  absl::Status ExportTorchScript(const std::string& path) override { return Save(path); }
  absl::Status Load(const std::string& path) override {
    TRAINCTL_ASSIGN_OR_RETURN(torch::jit::Module other, LoadScript(path));
    TRAINCTL_RETURN_IF_ERROR(
        CopyNamed(NamedParameters(), ScriptNamed(other.named_parameters()), path));
    return CopyNamed(NamedBuffers(), ScriptNamed(other.named_buffers()), path);
  }

 private:
  const std::string name_ = "torchscript";
  torch::jit::Module module_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelOptions& options) {
  if (options.name == "mlp") {
    const MlpOptions& o = options.mlp;
    TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("mlp input_dim", o.input_dim, 1));
    TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("mlp output_dim", o.output_dim, 1));
    for (size_t i = 0; i < o.hidden_sizes.size(); ++i) {
      TRAINCTL_RETURN_IF_ERROR(
          CheckAtLeast(absl::StrCat("mlp hidden_sizes[", i, "]"), o.hidden_sizes[i], 1));
    }
    return std::unique_ptr<Model>(new NnModel<MlpNet, MlpOptions>("mlp", o));
  }
  if (options.name == "cnn") {
    const CnnOptions& o = options.cnn;
    TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("cnn in_channels", o.in_channels, 1));
    TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("cnn conv1_channels", o.conv1_channels, 1));
    TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("cnn conv2_channels", o.conv2_channels, 1));
    TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("cnn hidden", o.hidden, 1));
    TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("cnn classes", o.classes, 1));
    if (o.image_size < 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("cnn image_size must be >= 4 (two 2x2 pools), got ", o.image_size));
    }
    return std::unique_ptr<Model>(new NnModel<CnnNet, CnnOptions>("cnn", o));
  }
  if (options.name == "torchscript") {
    if (options.torchscript.path.empty()) {
      return absl::InvalidArgumentError("torchscript path must be set");
    }
    TRAINCTL_ASSIGN_OR_RETURN(torch::jit::Module module, LoadScript(options.torchscript.path));
    return std::unique_ptr<Model>(new ScriptModel(std::move(module)));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "model name '", options.name, "' is unknown; expected one of mlp, cnn, torchscript"));
}

}  // namespace trainctl::engine
