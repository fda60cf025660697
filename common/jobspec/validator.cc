#include "common/jobspec/validator.h"

#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jobspec/gpu_flavor.h"
#include "common/jobspec/spec_bounds.h"

namespace trainctl::jobspec {
namespace {

// The checks' state for one spec (see validator.h).
class Validator {
 public:
  Validator(std::string file, const absl::flat_hash_map<std::string, Position>* positions,
            const absl::flat_hash_set<std::string>* error_paths)
      : file_(std::move(file)), positions_(positions), error_paths_(error_paths) {}

  std::vector<SpecError> Run(const v1::JobSpec& raw) {
    // A gRPC client is not held to the YAML parser's limits: bound the whole
    // spec, every string, list and enum here, before anything else reads it.
    const size_t bytes = raw.ByteSizeLong();
    if (bytes > kMaxSpecBytes) {
      Error("spec", absl::StrCat("is ", bytes, " bytes; at most ", kMaxSpecBytes, " (1 MiB)"));
      return std::move(errors_);
    }
    CheckBounds(raw, "");
    if (!errors_.empty()) return std::move(errors_);
    v1::JobSpec s = raw;
    ResolveJobSpecDefaults(&s);
    CheckName(raw.name());
    Range("world_size", raw.world_size(), 1, 65536, /*zero_is_default=*/true);
    Range("priority", raw.priority(), -1000, 1000, true);
    if (raw.has_command()) {
      CheckCommand(raw);
    } else {
      CheckModel(raw);
      CheckData(raw, s);
      CheckTraining(raw, s);
    }
    CheckDevice(s);
    CheckDdp(raw);
    Bounded("checkpoint.every_epochs", raw.checkpoint().every_epochs(), false);
    Bounded("checkpoint.keep", raw.checkpoint().keep(), true);
    Bounded("checkpoint.every_steps", raw.checkpoint().every_steps(), false);
    Range("restart.max_restarts", raw.restart().max_restarts(), 0, 1000, false);
    // -1: no progress check (docs/failures.md#hangs).
    Range("restart.progress_timeout_s", raw.restart().progress_timeout_s(), -1, 7 * 24 * 3600,
          false);
    Range("restart.disk_full_wait_s", raw.restart().disk_full_wait_s(), 0, 7 * 24 * 3600, false);
    Bounded("metrics.every_steps", raw.metrics().every_steps(), true);
    CheckHealth(raw);
    if (const double t = raw.stragglers().threshold();
        (t != 0 || Written("stragglers.threshold")) && (!std::isfinite(t) || t <= 0 || t > 100)) {
      Error("stragglers.threshold",
            absl::StrCat("must be in (0, 100] (a fraction: 0.3 = 30% slower than the median), got ",
                         FormatNumber(t)));
    }
    CheckScheduling(raw, s);
    CheckResources(raw.resources());
    CheckGpuFlavor(raw.resources().gpu_flavor(), s);
    CheckResumeFrom(raw.resume_from().job());
    CheckElastic(raw, s);
    return std::move(errors_);
  }

 private:
  bool Written(const std::string& path) const {
    return positions_ != nullptr && positions_->contains(path);
  }

  // Skips fields that already failed to parse, and their parents/children.
  bool Suppressed(const std::string& path) const {
    if (error_paths_ == nullptr) return false;
    for (const std::string& e : *error_paths_) {
      if (e == path || absl::StartsWith(path, e + ".") || absl::StartsWith(e, path + "."))
        return true;
    }
    return false;
  }

  void Error(const std::string& path, std::string message) {
    if (Suppressed(path)) return;
    SpecError e;
    e.field = path;
    e.message = std::move(message);
    if (positions_ != nullptr) {
      // The field's own position, else its nearest written ancestor's, else 1:1.
      std::string p = path;
      e.file = file_;
      e.line = 1;
      e.column = 1;
      while (true) {
        auto it = positions_->find(p);
        if (it != positions_->end()) {
          if (it->second.from_override) {
            e.file = "--set";
            e.line = e.column = 0;
          } else {
            e.line = it->second.line;
            e.column = it->second.column;
          }
          break;
        }
        size_t dot = p.find_last_of('.');
        if (dot == std::string::npos) break;
        p = p.substr(0, dot);
      }
    }
    errors_.push_back(std::move(e));
  }

  // lo <= v <= hi. A zero that means "default" is fine unless it was written.
  // Range with the bounds of spec_bounds.h (shared with the rank's parser).
  void Bounded(const std::string& path, int64_t v, bool zero_is_default) {
    const spec_bounds::IntBound* b = spec_bounds::FindBound(path);
    if (b == nullptr) {
      Error(path, "internal: no bound in spec_bounds.h");
      return;
    }
    Range(path, v, b->lo, b->hi, zero_is_default);
  }

  void Range(const std::string& path, int64_t v, int64_t lo, int64_t hi, bool zero_is_default) {
    if (v == 0 && zero_is_default && !Written(path)) return;
    if (v < lo || v > hi) {
      if (lo == 1 && v < lo) {
        Error(path, absl::StrCat("must be > 0, got ", v));
      } else if (lo == 0 && v < lo) {
        Error(path, absl::StrCat("must be >= 0, got ", v));
      } else {
        Error(path, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
      }
    }
  }

  void PositiveNumber(const std::string& path, double v, bool zero_is_default) {
    if (v == 0 && zero_is_default && !Written(path)) return;
    if (!std::isfinite(v) || v <= 0)
      Error(path, absl::StrCat("must be > 0, got ", FormatNumber(v)));
  }

  void NonNegativeNumber(const std::string& path, double v) {
    if (!std::isfinite(v) || v < 0)
      Error(path, absl::StrCat("must be >= 0, got ", FormatNumber(v)));
  }

  void UnitInterval(const std::string& path, double v) {
    if (!std::isfinite(v) || v < 0 || v >= 1) {
      Error(path, absl::StrCat("must be in [0, 1), got ", FormatNumber(v)));
    }
  }

  void Required(const std::string& path, const std::string& v) {
    if (v.empty()) Error(path, "required");
  }

  // Strings at most kMaxStringBytes and without NUL (they become paths and
  // config lines), lists at most kMaxSequenceLength, enums known values.
  void CheckBounds(const Message& m, const std::string& prefix) {
    const Reflection* r = m.GetReflection();
    std::vector<const FieldDescriptor*> fields;
    r->ListFields(m, &fields);
    for (const FieldDescriptor* f : fields) {
      const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
      if (f->is_map()) {
        const int n = r->FieldSize(m, f);
        if (n > kMaxSequenceLength) {
          Error(path, absl::StrCat("at most ", kMaxSequenceLength, " entries, got ", n));
          continue;
        }
        for (int i = 0; i < n; ++i) {
          const Message& e = r->GetRepeatedMessage(m, f, i);
          const Descriptor* ed = e.GetDescriptor();
          std::string key = e.GetReflection()->GetString(e, ed->map_key());
          std::string entry_path =
              absl::StrCat(path, ".", key.size() > 64 ? key.substr(0, 64) : key);
          CheckBoundsValue(e, ed->map_key(), -1, entry_path);
          CheckBoundsValue(e, ed->map_value(), -1, entry_path);
        }
        continue;
      }
      if (f->is_repeated()) {
        const int n = r->FieldSize(m, f);
        if (n > kMaxSequenceLength) {
          Error(path, absl::StrCat("at most ", kMaxSequenceLength, " items, got ", n));
          continue;
        }
        for (int i = 0; i < n; ++i) CheckBoundsValue(m, f, i, absl::StrCat(path, "[", i, "]"));
      } else {
        CheckBoundsValue(m, f, -1, path);
      }
    }
  }

  void CheckBoundsValue(const Message& m, const FieldDescriptor* f, int index,
                        const std::string& path) {
    const Reflection* r = m.GetReflection();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING: {
        std::string scratch;
        const std::string& v = index < 0 ? r->GetStringReference(m, f, &scratch)
                                         : r->GetRepeatedStringReference(m, f, index, &scratch);
        if (v.size() > kMaxStringBytes) {
          Error(path, absl::StrCat("at most ", kMaxStringBytes, " bytes, got ", v.size()));
        } else if (v.find('\0') != std::string::npos) {
          Error(path, "contains a NUL byte");
        } else if (!IsValidUtf8(v)) {
          // protobuf refuses to parse such a string field: the spec would
          // pass here and fail on the wire (or in the rank's config).
          Error(path, "is not valid UTF-8");
        } else if (auto c = std::find_if(v.begin(), v.end(),
                                         [](char ch) {
                                           // Tabs and line breaks may be meant (a script);
                                           // other C0 controls and DEL never are.
                                           return ((ch >= 0 && ch < 0x20) || ch == 0x7f) &&
                                                  ch != '\t' && ch != '\n' && ch != '\r';
                                         });
                   c != v.end()) {
          Error(path,
                absl::StrCat("contains a control character (0x",
                             absl::Hex(static_cast<unsigned char>(*c), absl::kZeroPad2), ")"));
        }
        break;
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        const int v = index < 0 ? r->GetEnumValue(m, f) : r->GetRepeatedEnumValue(m, f, index);
        if (f->enum_type()->FindValueByNumber(v) == nullptr) {
          Error(path, absl::StrCat("unknown value ", v, "; expected one of ",
                                   absl::StrJoin(EnumChoices(f->enum_type()), ", ")));
        }
        break;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        CheckBounds(index < 0 ? r->GetMessage(m, f) : r->GetRepeatedMessage(m, f, index), path);
        break;
      default:
        break;
    }
  }

  // The user's program: argv, and an environment that leaves torchrun's
  // contract to the worker. The built-in engine's blocks are not allowed with it.
  void CheckCommand(const v1::JobSpec& raw) {
    const v1::CommandSpec& c = raw.command();
    for (const char* other : {"model", "data", "training"}) {
      const FieldDescriptor* f = v1::JobSpec::descriptor()->FindFieldByName(other);
      if (raw.GetReflection()->HasField(raw, f)) {
        Error(other,
              "not allowed with command: a job runs either trainctl's engine "
              "(model, data, training) or its own command, not both");
      }
    }
    if (c.argv_size() == 0) {
      Error("command.argv", "required: the program and its arguments, e.g. [python3, train.py]");
    } else if (c.argv(0).empty()) {
      Error("command.argv[0]", "must name the program, got an empty string");
    }
    for (const auto& [name, value] : c.env()) {
      std::string path = absl::StrCat("command.env.", name);
      bool ok = !name.empty() && !(name[0] >= '0' && name[0] <= '9') &&
                std::all_of(name.begin(), name.end(), [](char ch) {
                  return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
                         (ch >= '0' && ch <= '9') || ch == '_';
                });
      if (!ok) {
        Error(path, "not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)");
      } else if (IsCommandContractVariable(name)) {
        Error(path,
              "set by the worker for every rank (torchrun's contract); it cannot be overridden");
      }
    }
  }

  // A job id: the name's characters plus the "-xxxxxx" the coordinator adds.
  void CheckHealth(const v1::JobSpec& raw) {
    const v1::HealthSpec& h = raw.health();
    if (!raw.has_health()) return;
    if (raw.has_command()) {
      Error("health", "only for trainctl's engine (a command job's NaNs are its own)");
      return;
    }
    if (h.has_max_rollbacks()) Range("health.max_rollbacks", h.max_rollbacks(), 0, 1000, false);
    if (h.has_min_loss_scale()) NonNegativeNumber("health.min_loss_scale", h.min_loss_scale());
    if (h.has_max_skipped_steps())
      Bounded("health.max_skipped_steps", h.max_skipped_steps(), false);
    if (h.divergence().has_factor()) {
      const double f = h.divergence().factor();
      if (!std::isfinite(f) || (f != 0 && f <= 1)) {
        Error("health.divergence.factor",
              absl::StrCat("must be 0 (off) or > 1, got ", FormatNumber(f)));
      }
    }
    if (h.debug_nan_at_step() < 0) {
      Error("health.debug_nan_at_step", absl::StrCat("must be >= 0, got ", h.debug_nan_at_step()));
    }
  }

  void CheckScheduling(const v1::JobSpec& raw, const v1::JobSpec& spec) {
    const v1::SchedulingSpec& s = raw.scheduling();
    const double t = s.pending_timeout_s();
    if (!std::isfinite(t) || t < 0) {
      Error("scheduling.pending_timeout_s",
            absl::StrCat("must be >= 0 (0 = wait forever), got ", FormatNumber(t)));
    }
    // 0 = the queue's default (else none); a tiny positive limit is the
    // user's to choose (a test's 2 s).
    const double r = s.max_runtime_s();
    if (!std::isfinite(r) || r < 0) {
      Error("scheduling.max_runtime_s",
            absl::StrCat("must be >= 0 seconds (0 = the queue's default, else no limit), got ",
                         FormatNumber(r)));
    }
    // Hosts the job spans (torchrun's --nnodes): world_size / nodes ranks
    // on each, so it must divide world_size.
    const int nodes = s.nodes();
    if (nodes < 0) {
      Error("scheduling.nodes",
            absl::StrCat("must be >= 0 (0 = wherever the ranks fit), got ", nodes));
    } else if (nodes > 0 && spec.world_size() % nodes != 0) {
      Error("scheduling.nodes",
            absl::StrCat("must divide world_size (", spec.world_size(),
                         ") so that every node runs the same number of ranks, got ", nodes));
    } else if (nodes > 0 && raw.has_elastic() && raw.elastic().min_ranks() > 0) {
      Error("scheduling.nodes",
            "does not combine with elastic.min_ranks: an elastic job's size changes, and "
            "N nodes of world_size / N ranks would not hold; leave one of them out");
    }
  }

  void CheckResources(const v1::ResourceSpec& r) {
    for (SpecError& e : CheckResourceSpec(r, "resources")) Error(e.field, std::move(e.message));
  }

  // A flavor names a GPU model: it must be a valid name, and the job must
  // run on GPUs (a CPU job would wait forever for a GPU slot it cannot use).
  void CheckGpuFlavor(const std::string& flavor, const v1::JobSpec& s) {
    if (flavor.empty()) return;
    if (std::string problem = GpuFlavorProblem(flavor); !problem.empty()) {
      Error("resources.gpu_flavor", absl::StrCat(problem, ", got '", flavor, "'"));
    } else if (s.device() == v1::DEVICE_CPU) {
      Error("resources.gpu_flavor",
            absl::StrCat("asks for GPUs of flavor ", flavor,
                         ", but device is cpu: a CPU job runs on CPU slots, which have no flavor; "
                         "leave gpu_flavor out or set device: cuda"));
    }
  }

  void CheckResumeFrom(const std::string& id) {
    if (id.empty()) return;
    bool ok = id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) {
                return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
              });
    if (!ok) Error("resume_from.job", "not a job id ([a-z0-9-], at most 128 characters)");
  }

  void CheckName(const std::string& name) {
    if (name.empty()) {
      Error("name", "required");
      return;
    }
    bool chars_ok = std::all_of(name.begin(), name.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
    });
    if (!chars_ok || name.front() == '-' || name.back() == '-') {
      Error("name", absl::StrCat("must be lower-case letters, digits and '-', starting and ending "
                                 "with a letter or digit, got ",
                                 Quote(name)));
    } else if (name.size() > 63) {
      Error("name", absl::StrCat("at most 63 characters, got ", name.size()));
    }
  }

  void CheckModel(const v1::JobSpec& raw) {
    const v1::ModelSpec& m = raw.model();
    switch (m.kind_case()) {
      case v1::ModelSpec::KIND_NOT_SET:
        Error("model", "required (name: mlp, cnn or torchscript), or a command: block");
        break;
      case v1::ModelSpec::kMlp:
        Bounded("model.input_dim", m.mlp().input_dim(), false);
        Bounded("model.classes", m.mlp().classes(), false);
        for (int i = 0; i < m.mlp().hidden_size(); ++i) {
          Range(absl::StrCat("model.hidden[", i, "]"), m.mlp().hidden(i), 1, 1 << 20, false);
        }
        break;
      case v1::ModelSpec::kCnn: {
        const v1::CnnModel& c = m.cnn();
        Bounded("model.classes", c.classes(), false);
        Bounded("model.conv1_channels", c.conv1_channels(), true);
        Bounded("model.conv2_channels", c.conv2_channels(), true);
        Bounded("model.hidden", c.hidden(), true);
        Bounded("model.image_size", c.image_size(), true);
        if (c.image_size() != 0 && c.image_size() % 4 != 0) {
          Error("model.image_size",
                absl::StrCat("must be a multiple of 4 (two 2x2 poolings), got ", c.image_size()));
        }
        break;
      }
      case v1::ModelSpec::kTorchscript:
        Required("model.path", m.torchscript().path());
        break;
    }
  }

  void CheckDataset(const std::string& path, const v1::DatasetSpec& d) {
    switch (d.format_case()) {
      case v1::DatasetSpec::FORMAT_NOT_SET:
        Error(path, "required (format: synthetic, idx, csv or tensors)");
        break;
      case v1::DatasetSpec::kSynthetic: {
        const v1::SyntheticData& s = d.synthetic();
        if (s.length() <= 0 || s.length() > (int64_t{1} << 40)) {
          Error(path + ".length", absl::StrCat("must be in [1, 2^40], got ", s.length()));
        }
        Range(path + ".size", s.size(), 1, 1 << 24, false);
        Range(path + ".classes", s.classes(), 0, 1 << 24, false);
        Range(path + ".target_dim", s.target_dim(), 1, 1 << 24, true);
        if (s.classes() > 0 && s.target_dim() != 0) {
          Error(path + ".target_dim", "only for regression targets (classes: 0)");
        }
        break;
      }
      case v1::DatasetSpec::kIdx:
        Required(path + ".images", d.idx().images());
        Required(path + ".labels", d.idx().labels());
        break;
      case v1::DatasetSpec::kCsv:
        Required(path + ".path", d.csv().path());
        break;
      case v1::DatasetSpec::kTensors:
        Required(path + ".path", d.tensors().path());
        break;
    }
  }

  void CheckData(const v1::JobSpec& raw, const v1::JobSpec& s) {
    const v1::DataSpec& d = raw.data();
    CheckDataset("data.train", d.train());
    if (d.has_eval()) CheckDataset("data.eval", d.eval());
    Bounded("data.batch_size", d.batch_size(), true);
    Bounded("data.num_workers", d.num_workers(), false);

    // The classic example's shapes must fit the model.
    const v1::ModelSpec& m = s.model();
    for (const char* which : {"train", "eval"}) {
      const v1::DatasetSpec& ds = std::string(which) == "train" ? d.train() : d.eval();
      if (!ds.has_synthetic()) continue;
      std::string path = absl::StrCat("data.", which);
      if (m.has_mlp() && ds.synthetic().size() > 0 && m.mlp().input_dim() > 0 &&
          ds.synthetic().size() != m.mlp().input_dim()) {
        Error(path + ".size", absl::StrCat("must equal model.input_dim (", m.mlp().input_dim(),
                                           "), got ", ds.synthetic().size()));
      }
      int32_t model_out = m.has_mlp() ? m.mlp().classes() : m.has_cnn() ? m.cnn().classes() : 0;
      if (s.training().loss() == v1::LOSS_CROSS_ENTROPY && ds.synthetic().classes() == 0 &&
          ds.synthetic().size() > 0) {
        Error(path + ".classes", "cross_entropy needs class targets: set classes > 0 or loss: mse");
      } else if (model_out > 0 && ds.synthetic().classes() > model_out) {
        Error(path + ".classes", absl::StrCat("must be <= model.classes (", model_out, "), got ",
                                              ds.synthetic().classes()));
      }
    }
  }

  void CheckTraining(const v1::JobSpec& raw, const v1::JobSpec& s) {
    const v1::TrainingSpec& t = raw.training();
    Bounded("training.epochs", t.epochs(), true);
    Bounded("training.grad_accumulation", t.grad_accumulation(), true);
    NonNegativeNumber("training.max_grad_norm", t.max_grad_norm());

    const v1::OptimizerSpec& o = t.optimizer();
    PositiveNumber("training.optimizer.lr", o.lr(), true);
    NonNegativeNumber("training.optimizer.weight_decay", o.weight_decay());
    UnitInterval("training.optimizer.momentum", o.momentum());
    if (o.momentum() != 0 && s.training().optimizer().name() != v1::OPTIMIZER_SGD) {
      Error("training.optimizer.momentum", "only for name: sgd (Adam uses beta1)");
    }
    if (o.has_beta1()) UnitInterval("training.optimizer.beta1", o.beta1());
    if (o.has_beta2()) UnitInterval("training.optimizer.beta2", o.beta2());
    if (o.has_eps()) PositiveNumber("training.optimizer.eps", o.eps(), false);

    const v1::LrScheduleSpec& l = t.lr_schedule();
    Bounded("training.lr_schedule.warmup_steps", l.warmup_steps(), false);
    Bounded("training.lr_schedule.step_size", l.step_size(), true);
    if (s.training().lr_schedule().name() == v1::LR_SCHEDULE_STEP && l.step_size() == 0) {
      Error("training.lr_schedule.step_size", "required for name: step");
    }
    if (l.has_gamma() && (!std::isfinite(l.gamma()) || l.gamma() <= 0 || l.gamma() > 1)) {
      Error("training.lr_schedule.gamma",
            absl::StrCat("must be in (0, 1], got ", FormatNumber(l.gamma())));
    }
    NonNegativeNumber("training.lr_schedule.min_lr", l.min_lr());
    if (s.training().optimizer().lr() > 0 && l.min_lr() > s.training().optimizer().lr()) {
      Error("training.lr_schedule.min_lr", absl::StrCat("must be <= training.optimizer.lr (",
                                                        FormatNumber(s.training().optimizer().lr()),
                                                        "), got ", FormatNumber(l.min_lr())));
    }

    if (s.training().loss() == v1::LOSS_MSE && s.data().train().has_idx()) {
      Error("training.loss",
            "mse needs float targets; idx data has class labels (use cross_entropy)");
    }
  }

  void CheckDevice(const v1::JobSpec& s) {
    if (s.backend() == v1::BACKEND_NCCL && s.device() == v1::DEVICE_CPU) {
      Error("backend", "nccl needs device: cuda (use gloo or auto on cpu)");
    }
    if (s.backend() == v1::BACKEND_GLOO && s.device() == v1::DEVICE_CUDA) {
      Error("backend", "gloo runs on CPU tensors; use nccl (or auto) with device: cuda");
    }
    if (s.training().amp().enabled() && s.training().amp().dtype() == v1::AMP_DTYPE_FP16 &&
        s.device() == v1::DEVICE_CPU) {
      Error("training.amp.dtype", "fp16 autocast needs device: cuda; use bf16 on cpu");
    }
  }

  void CheckElastic(const v1::JobSpec& raw, const v1::JobSpec& s) {
    if (!raw.has_elastic()) return;
    const v1::ElasticSpec& e = raw.elastic();
    if (e.min_ranks() < 0 || e.min_ranks() > s.world_size()) {
      Error("elastic.min_ranks",
            absl::StrCat("must be in [1, world_size = ", s.world_size(), "], got ", e.min_ranks()));
    }
    Range("elastic.replace_timeout_s", e.replace_timeout_s(), 0, 7 * 24 * 3600, false);
  }

  void CheckDdp(const v1::JobSpec& raw) {
    const v1::DdpSpec& d = raw.ddp();
    if (!(d.bucket_cap_mb() == 0 && !Written("ddp.bucket_cap_mb")) &&
        (!std::isfinite(d.bucket_cap_mb()) || d.bucket_cap_mb() <= 0 || d.bucket_cap_mb() > 4096)) {
      Error("ddp.bucket_cap_mb",
            absl::StrCat("must be in (0, 4096], got ", FormatNumber(d.bucket_cap_mb())));
    }
    const v1::PowerSgdSpec& ps = d.powersgd();
    Bounded("ddp.powersgd.rank", ps.rank(), true);
    Bounded("ddp.powersgd.start_iter", ps.start_iter(), false);
    const double rate = ps.min_compression_rate();
    if (!(rate == 0 && !Written("ddp.powersgd.min_compression_rate")) &&
        (!std::isfinite(rate) || rate < 1)) {
      Error("ddp.powersgd.min_compression_rate",
            absl::StrCat("must be >= 1 (a matrix is compressed only when that many times "
                         "smaller), got ",
                         FormatNumber(rate)));
    }
  }

  std::string file_;
  const absl::flat_hash_map<std::string, Position>* positions_;
  const absl::flat_hash_set<std::string>* error_paths_;
  std::vector<SpecError> errors_;
};

}  // namespace

std::vector<SpecError> CheckJobSpec(const v1::JobSpec& raw, const std::string& file,
                                    const absl::flat_hash_map<std::string, Position>* positions,
                                    const absl::flat_hash_set<std::string>* error_paths) {
  return Validator(file, positions, error_paths).Run(raw);
}

}  // namespace trainctl::jobspec

namespace trainctl {

std::vector<SpecError> CheckResourceSpec(const v1::ResourceSpec& r, std::string_view prefix) {
  // 0 (or left out) is "no limit"; a CPU quota below 1% of a core is below
  // what CFS can enforce; memory below 1 MiB cannot even hold the program.
  std::vector<SpecError> errors;
  auto error = [&](const char* field, std::string message) {
    SpecError e;
    e.field = absl::StrCat(std::string(prefix), ".", field);
    e.message = std::move(message);
    errors.push_back(std::move(e));
  };
  const double cpus = r.cpus();
  if (!std::isfinite(cpus) || cpus < 0 || (cpus > 0 && cpus < 0.01) || cpus > 4096) {
    error("cpus", absl::StrCat("must be 0 (no limit) or in [0.01, 4096] CPUs, got ",
                               jobspec::FormatNumber(cpus)));
  }
  if (r.memory() < 0 || (r.memory() > 0 && r.memory() < (int64_t{1} << 20))) {
    error("memory",
          absl::StrCat("must be 0 (no limit) or at least 1Mi (1048576 bytes), got ", r.memory()));
  }
  if (r.pids() < 0 || (r.pids() > 0 && r.pids() < 8) || r.pids() > (int64_t{1} << 22)) {
    error("pids", absl::StrCat("must be 0 (no limit) or in [8, 4194304], got ", r.pids()));
  }
  return errors;
}

}  // namespace trainctl
