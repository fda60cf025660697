// Pre-flight: what a worker checks, after placement and before any rank of
// an attempt starts, so that a missing file or a full disk fails the attempt
// at once, naming the worker, instead of after every rank loaded LibTorch
// and formed its communicator (docs/failures.md "Pre-flight").
//
// Checks, for the ranks this worker will run:
//  * engine jobs: every data and model file (data.train/eval.*, model.path)
//    resolves inside --data-root, exists, is readable and has the expected
//    header (IDX: the 0x0000 08 magic and the dimension count; CSV: a
//    non-empty first line; tensors/TorchScript: a zip archive, "PK\3\4");
//  * the checkpoint directory is not claimed by another owner (job_dir.h;
//    the message names the owner), can be created, a file can be written in
//    it, and it has room for one checkpoint (the size of the one resumed, when
//    the attempt resumes one);
//  * command jobs: --allow-commands, command.working_dir is a directory,
//    argv[0] is an executable (through PATH without a '/');
//  * GPU slots: each device node (/dev/nvidiaN) exists, and for engine jobs
//    NCCL (libnccl.so.2) loads.
// Not checked (yet): that a GPU is free of other processes, that rank 0's
// rendezvous port is reachable from the other workers.
//
// Called by the daemon's RankTable on a Preflight message; stateless; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainctl/v1/job.pb.h"
#include "worker/daemon/job_dir.h"

namespace trainctl::worker {

struct PreflightContext {
  std::string job_id;
  // Job.owner and the owner of the job it resumes (job_dir.h CheckDirClaim).
  std::string owner;
  std::string resume_owner;
  // The daemon's working directory: relative job paths resolve against it.
  std::string base_dir;
  // --work-dir: the default checkpoint directory lies under it.
  std::string work_dir;
  // Where data and model files may be read (empty: anywhere), and how
  // errors name them.
  std::vector<std::string> data_roots;
  std::string data_roots_name = "--data-root";
  // Where a command job's working_dir may be (--data-root as given; empty:
  // anywhere).
  std::vector<std::string> command_dir_roots;
  std::vector<std::string> checkpoint_roots;
  bool allow_commands = false;
  // Whose checkpoint-directory manifests are trusted (job_dir.h), and
  // whether the checks run as the rank user (AsRankUser; for messages).
  ManifestWriters manifest_writers;
  bool as_rank_user = false;
  // Bytes one checkpoint needs (0 = unknown: only writability is checked).
  int64_t checkpoint_bytes = 0;
  // CUDA device indices of this worker's GPU slots in the attempt.
  std::vector<int> gpu_indices;
  // Where the device nodes are (tests point it elsewhere).
  std::string dev_dir = "/dev";
};

// One line per problem ("data.train.path /d/x.csv: no such file"); empty
// when the attempt may start here. `space_problems` (optional) gets how many
// of them are only a lack of space in the checkpoint directory (too little
// free for one checkpoint, or ENOSPC/EDQUOT making or writing in it): when
// all are, the attempt waits for space (PreflightReport.waiting_for_space)
// instead of failing the job.
std::vector<std::string> PreflightProblems(const v1::JobSpec& spec, const PreflightContext& ctx,
                                           int* space_problems = nullptr);

}  // namespace trainctl::worker
