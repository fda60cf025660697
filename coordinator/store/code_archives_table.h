// The store's code archives (StateStore::code_archives(); CommandSpec.code,
// JobService.UploadCode): one row per archive, keyed by its digest
// ("sha256:<hex>", checked by the caller), with its bytes as one blob -- in
// the store, not in a directory, so a standby that takes over serves it too.
// A job row records the digest its spec names (jobs.code_digest, written by
// JobsTable::PutJob), which keeps the archive: DeleteUnreferencedCode reads
// the jobs table in its one DELETE statement, so no job can come to name an
// archive between the check and the delete.
//
// Writes are transactions (fenced on PostgreSQL, counted in the write
// health). Threading: every method takes the store's one lock
// (state_store.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trainctl::coordinator {

class StateStore;
namespace store_internal {
struct StoreCore;
}  // namespace store_internal

class CodeArchives {
 public:
  CodeArchives(const CodeArchives&) = delete;
  CodeArchives& operator=(const CodeArchives&) = delete;

  // Stores the archive (one commit). Storing a digest again keeps the bytes
  // and refreshes `uploaded` (a re-upload restarts the unreferenced grace).
  absl::Status PutCode(const std::string& digest, absl::string_view bytes, absl::Time uploaded);
  // The archive's size in bytes, or nullopt when it is not stored.
  absl::StatusOr<std::optional<int64_t>> CodeSize(const std::string& digest);
  // Sets the archive's upload time to `uploaded` (UploadCode's answer
  // "already stored" counts as an upload); NotFound when not stored.
  absl::Status TouchCode(const std::string& digest, absl::Time uploaded);
  // At most `max_bytes` of the archive from byte `offset` (empty at or past
  // its end); NotFound when not stored, InvalidArgument for a negative
  // offset or a max_bytes < 1.
  absl::StatusOr<std::string> ReadCode(const std::string& digest, int64_t offset,
                                       int64_t max_bytes);
  // Deletes the archives uploaded before `cutoff` that no stored job names
  // (jobs.code_digest); returns how many (one commit).
  absl::StatusOr<int64_t> DeleteUnreferencedCode(absl::Time cutoff);

 private:
  friend class StateStore;
  explicit CodeArchives(store_internal::StoreCore& core) : core_(core) {}
  store_internal::StoreCore& core_;
};

}  // namespace trainctl::coordinator
