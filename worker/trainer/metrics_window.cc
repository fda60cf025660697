#include "worker/trainer/metrics_window.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace trainctl::trainer {

MetricsWindow::MetricsWindow(c10::Device device, Clock::time_point start)
    : loss_sum_(at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device))),
      start_(start) {}

void MetricsWindow::AddMicroBatch(const at::Tensor& loss, int64_t samples) {
  loss_sum_ += loss;
  ++micro_batches_;
  samples_ += samples;
}

void MetricsWindow::AddStep(double data_ms, double comm_ms, double step_ms) {
  ++steps_;
  data_ms_ += data_ms;
  comm_ms_ += comm_ms;
  step_ms_ += step_ms;
}

double MetricsWindow::MeanLoss() const {
  return loss_sum_.item<double>() / static_cast<double>(std::max<int64_t>(micro_batches_, 1));
}

double MetricsWindow::SamplesPerSec(Clock::time_point now) const {
  const double secs = std::chrono::duration<double>(now - start_).count();
  return secs > 0 ? static_cast<double>(samples_) / secs : 0;
}

void MetricsWindow::FillStepTimes(double steps, rankproto::RankMetric* m) const {
  m->data_ms = data_ms_ / steps;
  m->comm_ms = comm_ms_ / steps;
  m->compute_ms = std::max(0.0, (step_ms_ - data_ms_ - comm_ms_) / steps);
}

void MetricsWindow::Reset(Clock::time_point start) {
  loss_sum_.zero_();
  micro_batches_ = steps_ = samples_ = 0;
  data_ms_ = comm_ms_ = step_ms_ = 0;
  start_ = start;
}

}  // namespace trainctl::trainer
