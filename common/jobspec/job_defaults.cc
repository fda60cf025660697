// ResolveJobSpecDefaults (job_spec.h): the one place a job's defaults are
// written down. docs/job-yaml.md documents the same values, and
// job_defaults_test checks that both agree; the rank process reads the
// resolved values (JobSpecToFlat) and has no defaults of its own.
//
// Pure function; thread-safe.
#include "common/jobspec/job_spec.h"

namespace trainctl {
namespace {

// What every job has: placement, restarts and straggler detection.
void ResolveCommonDefaults(v1::JobSpec* s) {
  if (s->world_size() == 0) s->set_world_size(1);
  if (s->has_elastic()) {
    v1::ElasticSpec* e = s->mutable_elastic();
    if (!e->has_replace_timeout_s()) e->set_replace_timeout_s(60);
    if (e->grow() == v1::ELASTIC_GROW_UNSPECIFIED) e->set_grow(v1::ELASTIC_GROW_AT_CHECKPOINT);
  }
  if (s->device() == v1::DEVICE_UNSPECIFIED) s->set_device(v1::DEVICE_AUTO);
  if (s->backend() == v1::BACKEND_UNSPECIFIED) s->set_backend(v1::BACKEND_AUTO);
  v1::RestartSpec* restart = s->mutable_restart();
  if (!restart->has_max_restarts()) restart->set_max_restarts(3);
  if (!restart->has_disk_full_wait_s()) restart->set_disk_full_wait_s(600);
  if (restart->on_hang() == v1::HANG_POLICY_UNSPECIFIED)
    restart->set_on_hang(v1::HANG_POLICY_RESTART);
  v1::StragglerSpec* st = s->mutable_stragglers();
  if (st->policy() == v1::STRAGGLER_POLICY_UNSPECIFIED) st->set_policy(v1::STRAGGLER_POLICY_WARN);
  if (st->threshold() == 0) st->set_threshold(0.3);
  v1::CheckpointSpec* c = s->mutable_checkpoint();
  if (!c->has_every_epochs()) c->set_every_epochs(1);
  if (c->keep() == 0) c->set_keep(2);
}

// The user's program: how it learns its local rank.
void ResolveCommandDefaults(v1::CommandSpec* c) {
  if (c->local_rank() == v1::LOCAL_RANK_MODE_UNSPECIFIED)
    c->set_local_rank(v1::LOCAL_RANK_MODE_ENV);
  if (c->arg_style() == v1::LOCAL_RANK_ARG_STYLE_UNSPECIFIED) {
    c->set_arg_style(v1::LOCAL_RANK_ARG_STYLE_UNDERSCORE);
  }
}

void ResolveModelAndDataDefaults(v1::JobSpec* s) {
  if (s->model().has_cnn()) {
    v1::CnnModel* c = s->mutable_model()->mutable_cnn();
    if (c->conv1_channels() == 0) c->set_conv1_channels(32);
    if (c->conv2_channels() == 0) c->set_conv2_channels(64);
    if (c->hidden() == 0) c->set_hidden(128);
    if (c->image_size() == 0) c->set_image_size(28);
  }
  v1::DataSpec* d = s->mutable_data();
  for (v1::DatasetSpec* ds : {d->mutable_train(), d->has_eval() ? d->mutable_eval() : nullptr}) {
    if (ds == nullptr) continue;
    if (ds->has_synthetic() && ds->synthetic().classes() == 0 &&
        ds->synthetic().target_dim() == 0) {
      ds->mutable_synthetic()->set_target_dim(1);
    }
    if (ds->has_csv() && !ds->csv().has_header()) ds->mutable_csv()->set_header(true);
    if (ds->has_tensors()) {
      if (ds->tensors().inputs_key().empty()) ds->mutable_tensors()->set_inputs_key("inputs");
      if (ds->tensors().targets_key().empty()) ds->mutable_tensors()->set_targets_key("targets");
    }
  }
  if (d->batch_size() == 0) d->set_batch_size(32);
  if (!d->has_shuffle()) d->set_shuffle(true);
  if (!d->has_num_workers()) d->set_num_workers(0);
  if (!d->has_pin_memory()) d->set_pin_memory(true);
}

void ResolveTrainingDefaults(v1::JobSpec* s) {
  v1::TrainingSpec* t = s->mutable_training();
  if (t->epochs() == 0) t->set_epochs(1);
  if (t->loss() == v1::LOSS_UNSPECIFIED) t->set_loss(v1::LOSS_CROSS_ENTROPY);
  v1::OptimizerSpec* o = t->mutable_optimizer();
  if (o->name() == v1::OPTIMIZER_UNSPECIFIED) o->set_name(v1::OPTIMIZER_ADAM);
  if (o->lr() == 0) o->set_lr(0.001);
  if (!o->has_beta1()) o->set_beta1(0.9);
  if (!o->has_beta2()) o->set_beta2(0.999);
  if (!o->has_eps()) o->set_eps(1e-8);
  v1::LrScheduleSpec* l = t->mutable_lr_schedule();
  if (l->name() == v1::LR_SCHEDULE_UNSPECIFIED) l->set_name(v1::LR_SCHEDULE_CONSTANT);
  if (!l->has_gamma()) l->set_gamma(0.1);
  if (t->grad_accumulation() == 0) t->set_grad_accumulation(1);
  if (t->amp().dtype() == v1::AMP_DTYPE_UNSPECIFIED)
    t->mutable_amp()->set_dtype(v1::AMP_DTYPE_BF16);

  v1::DdpSpec* p = s->mutable_ddp();
  if (p->bucket_cap_mb() == 0) p->set_bucket_cap_mb(25);
  if (!p->has_broadcast_buffers()) p->set_broadcast_buffers(true);
  if (p->comm_hook() == v1::DDP_COMM_HOOK_UNSPECIFIED) p->set_comm_hook(v1::DDP_COMM_HOOK_NONE);
  // On where PyTorch's default is off: nothing is copied between the
  // gradients and the buckets, for the same bytes (docs/ddp.md).
  if (!p->has_gradient_as_bucket_view()) p->set_gradient_as_bucket_view(true);
  // PyTorch's PowerSGDState defaults.
  v1::PowerSgdSpec* ps = p->mutable_powersgd();
  if (ps->rank() == 0) ps->set_rank(1);
  if (!ps->has_start_iter()) ps->set_start_iter(1000);
  if (ps->min_compression_rate() == 0) ps->set_min_compression_rate(2);
  if (!ps->has_use_error_feedback()) ps->set_use_error_feedback(true);
  if (!ps->has_warm_start()) ps->set_warm_start(true);
  if (s->metrics().every_steps() == 0) s->mutable_metrics()->set_every_steps(20);

  // Numerical health: the rank reads min_loss_scale, max_skipped_steps and
  // divergence.factor,
  // the coordinator on_nan and max_rollbacks.
  v1::HealthSpec* h = s->mutable_health();
  if (h->on_nan() == v1::HealthSpec::ON_NAN_UNSPECIFIED)
    h->set_on_nan(v1::HealthSpec::ON_NAN_ROLLBACK);
  if (!h->has_max_rollbacks()) h->set_max_rollbacks(3);
  if (!h->has_min_loss_scale()) h->set_min_loss_scale(1e-4);
  if (!h->has_max_skipped_steps()) h->set_max_skipped_steps(50);
  if (!h->divergence().has_factor()) h->mutable_divergence()->set_factor(1e4);

  // Scheduling (the coordinator's): wait_for_capacity false, pending_timeout_s 0,
  // max_runtime_s 0 (the queue's default, else none).
  s->mutable_scheduling();
}

}  // namespace

void ResolveJobSpecDefaults(v1::JobSpec* s) {
  ResolveCommonDefaults(s);
  if (s->has_command()) {
    // The user's program: no engine settings to fill in.
    ResolveCommandDefaults(s->mutable_command());
    return;
  }
  ResolveModelAndDataDefaults(s);
  ResolveTrainingDefaults(s);
}

}  // namespace trainctl
