// DataLoader: one rank's batches for one epoch, in the order of the index
// list its DistributedSampler produced — PyTorch's DataLoader with
// sampler=DistributedSampler(...), shuffle=False.
//
// The rank process's training loop creates one per epoch:
//   sampler.set_epoch(e);
//   auto loader = DataLoader::Create(dataset, sampler.Indices(), options);
//   while (true) { auto batch = (*loader)->Next(); ... until std::nullopt }
// Batch b holds indices[b*batch_size, (b+1)*batch_size) gathered from the
// dataset's contiguous tensors (one index_select each); the last partial
// batch is dropped with drop_last, like PyTorch.
//
// Threading: num_workers == 0 builds each batch on the caller's thread inside
// Next(). With num_workers > 0 that many background threads build batches
// ahead of the consumer: a worker claims the next unclaimed batch number and
// may only claim batch b while b < (next batch to hand out) +
// num_workers * prefetch_factor, so at most that many finished batches wait
// in memory. Next() hands batches out strictly in batch order, so the
// sequence of batches is identical for every num_workers. Next() must be
// called from one thread at a time (the training loop); the loader's state is
// guarded by an absl::Mutex. Destroying the loader mid-epoch stops the
// workers (each finishes at most the batch it is building) and joins them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/engine/dataset.h"

namespace trainctl::engine {

struct DataLoaderOptions {
  int64_t batch_size = 1;   // >= 1, per rank
  bool drop_last = false;   // drop the last batch when it is smaller than batch_size
  int num_workers = 0;      // background batch builders; 0 = build in Next()
  int prefetch_factor = 2;  // batches in flight per worker (PyTorch's default), >= 1
  // Copy batches into page-locked memory so host-to-device copies can be
  // asynchronous (non_blocking). Only has an effect when CUDA is available;
  // on CPU-only builds or machines it is a no-op.
  bool pin_memory = false;
};

class DataLoader {
 public:
  // InvalidArgument naming the field for bad options; OutOfRange when an
  // index is outside the dataset. Starts the workers.
  static absl::StatusOr<std::unique_ptr<DataLoader>> Create(std::shared_ptr<const Dataset> dataset,
                                                            std::vector<int64_t> indices,
                                                            const DataLoaderOptions& options);

  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Batches this epoch yields (PyTorch's len(loader)).
  int64_t num_batches() const { return num_batches_; }

  // The next batch in order; std::nullopt once the epoch is exhausted. An
  // error building a batch is returned in that batch's place.
  absl::StatusOr<std::optional<Example>> Next();

 private:
  DataLoader(std::shared_ptr<const Dataset> dataset, std::vector<int64_t> indices,
             const DataLoaderOptions& options);

  // Builds batch `b` (gather + optional pin); touches no guarded state.
  absl::StatusOr<Example> BuildBatch(int64_t b) const;
  void WorkerLoop();

  const std::shared_ptr<const Dataset> dataset_;
  const std::vector<int64_t> indices_;
  const DataLoaderOptions options_;
  const int64_t num_batches_;
  const int64_t max_in_flight_;  // num_workers * prefetch_factor
  const bool pin_;               // pin_memory requested and CUDA available

  absl::Mutex mu_;
  int64_t next_to_deliver_ ABSL_GUARDED_BY(mu_) = 0;
  // Invariant: next_to_deliver_ <= next_to_claim_ <= next_to_deliver_ + max_in_flight_.
  int64_t next_to_claim_ ABSL_GUARDED_BY(mu_) = 0;
  // Finished batches not yet delivered, keyed by batch number.
  std::map<int64_t, absl::StatusOr<Example>> ready_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::vector<std::thread> workers_;  // written only in Create and the destructor
};

}  // namespace trainctl::engine
