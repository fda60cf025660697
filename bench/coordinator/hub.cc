// The simulated worker daemons (hub.h): the Hub's channels and timer threads,
// and a SimWorker's Session stream (registration, heartbeats, telemetry, and
// answers to the coordinator: preflight, rendezvous, RUNNING).
#include "bench/coordinator/hub.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainctl::bench {

Hub::Hub(const std::string& target, int channels, int64_t heartbeat_ns)
    : heartbeat_ns_(heartbeat_ns) {
  for (int i = 0; i < channels; ++i) {
    channels_.push_back(MakeChannel(target, i, g_worker_token));
    stubs_.push_back(v1::WorkerService::NewStub(channels_.back()));
  }
  job_channel_ = MakeChannel(target, channels, g_admin_token);
  jobs_ = v1::JobService::NewStub(job_channel_);
  workers_stub_ = v1::WorkerService::NewStub(job_channel_);
  int n = std::max(1, absl::GetFlag(FLAGS_tickers));
  for (int i = 0; i < n; ++i) shards_.push_back(std::make_unique<Shard>());
  for (int i = 0; i < n; ++i) {
    shards_[i]->thread = std::thread([this, i] { TickLoop(*shards_[i]); });
    pthread_setname_np(shards_[i]->thread.native_handle(), "bench-ticker");
  }
}

void Hub::StopTicker() {
  for (auto& sh : shards_) {
    {
      std::lock_guard<std::mutex> l(sh->mu);
      sh->stop = true;
    }
    sh->cv.notify_all();
    if (sh->thread.joinable()) sh->thread.join();
  }
}

void Hub::TickLoop(Shard& sh) {
  std::vector<Ev> due;
  while (true) {
    {
      std::unique_lock<std::mutex> l(sh.mu);
      while (!sh.stop) {
        int64_t now = NowNs();
        if (!sh.heap.empty() && sh.heap.top().t <= now) break;
        int64_t wait =
            sh.heap.empty() ? 50000000 : std::min<int64_t>(sh.heap.top().t - now, 50000000);
        sh.cv.wait_for(l, std::chrono::nanoseconds(wait));
      }
      if (sh.stop) return;
      int64_t now = NowNs();
      while (!sh.heap.empty() && sh.heap.top().t <= now) {
        due.push_back(sh.heap.top());
        sh.heap.pop();
      }
    }
    std::vector<Ev> next;
    for (const Ev& e : due) {
      int64_t own = e.w->hb_interval_ns.load();
      // The coordinator's terms, as a daemon keeps them (RegisterAck, then
      // any HeartbeatAck that changes them); the flag's until registered.
      int64_t interval = own > 0 ? own : heartbeat_ns_;
      if (e.w->Heartbeat(e.t)) next.push_back({e.t + interval, e.w});
    }
    due.clear();
    std::lock_guard<std::mutex> l(sh.mu);
    for (const Ev& e : next) sh.heap.push(e);
  }
}

void SimWorker::Start() {
  hub_->stub(index_)->async()->Session(&ctx_, this);
  AddHold();  // Writes come from outside reactions (the timer thread).
  StartRead(&in_);
  v1::WorkerMessage reg;
  v1::Register* r = reg.mutable_register_();
  r->set_worker_id(id_);
  r->set_hostname(id_.empty() ? absl::StrCat("sim-", index_) : id_);
  r->set_address("127.0.0.1");
  r->set_version("bench");
  for (int i = 0; i < slots_; ++i) {
    v1::Slot* s = r->add_slots();
    s->set_kind(kind_);
    s->set_index(i);
  }
  register_sent_ns = NowNs();
  Send(std::move(reg));
  StartCall();
}

bool SimWorker::Send(v1::WorkerMessage m) {
  std::unique_lock<std::mutex> l(mu_);
  if (stopping_) return false;
  if (writing_) {
    queue_.push_back(std::move(m));
    return true;
  }
  writing_ = true;
  current_ = std::move(m);
  l.unlock();
  StartWrite(&current_);
  return true;
}

bool SimWorker::Heartbeat(int64_t planned) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) return false;
  }
  int64_t seq = ++seq_;
  v1::WorkerMessage hb;
  hb.mutable_heartbeat()->set_seq(seq);
  int64_t now = NowNs();
  sent_ns_[seq % kRing].store(now, std::memory_order_relaxed);
  sent_seq_[seq % kRing].store(seq, std::memory_order_relaxed);
  if (!Send(std::move(hb))) return false;
  last_hb_sent_ns = now;
  hub_->heartbeats_sent++;
  hub_->lateness.Add(now - planned);
  if (on_heartbeat) on_heartbeat(now);
  return true;
}

void SimWorker::SendTelemetry(int log_lines) {
  std::map<std::string, std::pair<int, std::vector<int>>> running;
  {
    std::lock_guard<std::mutex> l(mu_);
    running = running_;
  }
  for (const auto& [job, attempt_ranks] : running) {
    for (int rank : attempt_ranks.second) {
      v1::WorkerMessage m;
      v1::MetricBatch* b = m.mutable_metrics();
      b->set_job_id(job);
      b->set_attempt(attempt_ranks.first);
      v1::MetricPoint* p = b->add_points();
      p->set_kind(v1::MetricPoint::KIND_TRAIN);
      p->set_rank(rank);
      p->set_step(++steps_);
      p->set_steps_per_epoch(1 << 30);
      absl::Time now = absl::Now();
      p->mutable_time()->set_seconds(absl::ToUnixSeconds(now));
      p->mutable_time()->set_nanos(static_cast<int32_t>(
          absl::ToInt64Nanoseconds(now - absl::FromUnixSeconds(absl::ToUnixSeconds(now)))));
      p->set_loss(1.0 / static_cast<double>(steps_));
      p->set_samples_per_sec(1000);
      m.set_seq(++telemetry_seq_);
      if (!Send(std::move(m))) return;
      points_sent++;
      if (log_lines <= 0) continue;
      v1::WorkerMessage lm;
      v1::LogChunk* c = lm.mutable_logs();
      c->set_job_id(job);
      c->set_attempt(attempt_ranks.first);
      c->set_rank(rank);
      for (int i = 0; i < log_lines; ++i) {
        v1::LogLine* line = c->add_lines();
        line->set_rank(rank);
        line->set_stream(v1::LogLine::STREAM_STDOUT);
        *line->mutable_time() = p->time();
        line->set_text(absl::StrCat("epoch 0 step ", steps_, " line ", i,
                                    ": loss=0.1234 lr=0.001 samples/s=1000.0"));
      }
      lm.set_seq(++telemetry_seq_);
      if (!Send(std::move(lm))) return;
      lines_sent += log_lines;
    }
  }
}

void SimWorker::OnWriteDone(bool ok) {
  std::unique_lock<std::mutex> l(mu_);
  if (!ok) {
    writing_ = false;
    queue_.clear();
    StopLocked(l);
    return;
  }
  if (!queue_.empty() && !stopping_) {
    current_ = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    StartWrite(&current_);
    return;
  }
  writing_ = false;
  if (stopping_) ReleaseLocked(l);
}

void SimWorker::OnReadDone(bool ok) {
  if (!ok) {
    std::unique_lock<std::mutex> l(mu_);
    read_done_ = true;
    StopLocked(l);
    return;
  }
  int64_t now = NowNs();
  const v1::CoordinatorMessage& m = in_;
  switch (m.msg_case()) {
    case v1::CoordinatorMessage::kHeartbeatAck: {
      int64_t seq = m.heartbeat_ack().seq();
      if (sent_seq_[seq % kRing].load(std::memory_order_relaxed) == seq) {
        hub_->rtt.Add(now - sent_ns_[seq % kRing].load(std::memory_order_relaxed));
      }
      hub_->acks++;
      if (m.heartbeat_ack().heartbeat_interval_ms() > 0) {
        hb_interval_ns = int64_t{m.heartbeat_ack().heartbeat_interval_ms()} * 1000000;
        hub_->terms_changed++;
      }
      break;
    }
    case v1::CoordinatorMessage::kRegisterAck: {
      {
        std::lock_guard<std::mutex> l(mu_);
        assigned_id_ = m.register_ack().worker_id();
      }
      register_ack_ns = now;
      hub_->register_lat.Add(now - register_sent_ns);
      hub_->registered++;
      int64_t interval = m.register_ack().heartbeat_interval_ms() > 0
                             ? int64_t{m.register_ack().heartbeat_interval_ms()} * 1000000
                             : hub_->heartbeat_ns();
      hb_interval_ns = interval;
      hub_->ScheduleHeartbeat(this, index_, now + std::min(interval, hub_->heartbeat_ns()));
      break;
    }
    case v1::CoordinatorMessage::kPreflight: {
      // A simulated host has whatever a job needs: every check passes
      // (the coordinator's --preflight is on by default).
      v1::WorkerMessage rep;
      rep.mutable_preflight()->set_job_id(m.preflight().job_id());
      rep.mutable_preflight()->set_attempt(m.preflight().attempt());
      Send(std::move(rep));
      break;
    }
    case v1::CoordinatorMessage::kStartRanks:
      if (auto_run && m.start_ranks().produce_rendezvous()) {
        v1::WorkerMessage rdv;
        rdv.mutable_rendezvous()->set_job_id(m.start_ranks().job_id());
        rdv.mutable_rendezvous()->set_attempt(m.start_ranks().attempt());
        rdv.mutable_rendezvous()->mutable_info()->set_gloo_store_address("127.0.0.1:29500");
        rdv.mutable_rendezvous()->mutable_info()->set_master_addr("127.0.0.1");
        rdv.mutable_rendezvous()->mutable_info()->set_master_port(29500);
        Send(std::move(rdv));
      }
      if (auto_run) {
        std::lock_guard<std::mutex> l(mu_);
        for (const auto& r : m.start_ranks().ranks()) {
          my_ranks_[m.start_ranks().job_id()].push_back(r.rank());
        }
      }
      break;
    case v1::CoordinatorMessage::kRendezvous:
      if (auto_run) {
        std::vector<int> ranks;
        {
          std::lock_guard<std::mutex> l(mu_);
          ranks = my_ranks_[m.rendezvous().job_id()];
          running_[m.rendezvous().job_id()] = {m.rendezvous().attempt(), ranks};
        }
        for (int r : ranks) {
          SendStatus(m.rendezvous().job_id(), m.rendezvous().attempt(), r, v1::RANK_STATE_RUNNING);
        }
      }
      break;
    default:
      break;
  }
  if (listener) listener(this, m, now);
  StartRead(&in_);
}

}  // namespace trainctl::bench
