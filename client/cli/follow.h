// What `trainctl submit --follow` prints while a job runs, fed one watch
// update at a time.
//
// On a terminal: one live status line redrawn in place with '\r' (state,
// progress bar, epoch, step, loss, samples/s, ETA), with a printed line per
// event (the epoch_end event is the epoch summary with eval loss/accuracy).
// Otherwise plain lines only: one per event, and at most one progress line
// per `progress_interval`. With json, one JobUpdate document per line.
//
// Not thread-safe: one watch callback feeds it.
#pragma once

#include <functional>
#include <ostream>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "trainctl/v1/job.pb.h"
#include "trainctl/v1/job_service.pb.h"

namespace trainctl::cli {

class FollowPrinter {
 public:
  struct Options {
    // Redraw a status line in place (stdout is a terminal).
    bool terminal = false;
    // Plain mode: least time between two progress lines.
    absl::Duration progress_interval = absl::Seconds(5);
    // Terminal mode: least time between two redraws of the status line.
    absl::Duration redraw_interval = absl::Milliseconds(100);
    bool json = false;
  };

  FollowPrinter(
      std::ostream& out, Options options,
      std::function<absl::Time()> now = [] { return absl::Now(); });

  void OnUpdate(const v1::JobUpdate& update);
  // Prints how the job ended; returns the exit code (0 only for SUCCEEDED).
  int Finish(const v1::Job& job);
  // Ends the live line before an error is printed.
  void Abort();

 private:
  void PrintEvent(const v1::Event& e);
  void PrintLine(const std::string& line);
  void DrawStatus(bool force);
  void ClearStatus();
  std::string StatusLine() const;

  std::ostream& out_;
  Options options_;
  std::function<absl::Time()> now_;

  v1::Job job_;  // Latest snapshot (without attempts).
  bool have_job_ = false;
  bool status_drawn_ = false;
  absl::Time last_draw_ = absl::InfinitePast();
  absl::Time last_progress_line_ = absl::InfinitePast();
  std::string last_progress_text_;
  // The PENDING reason last printed (plain output).
  std::string last_pending_reason_;
  int64_t skipped_reported_ = 0;
};

}  // namespace trainctl::cli
