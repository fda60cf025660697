#include "worker/daemon/artifact_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainctl::worker {

bool PathIsUnder(const std::string& path, const std::string& dir) {
  if (dir.empty()) return false;
  if (dir == "/") return true;
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/';
}

v1::FileChunk ReadArtifactChunk(const v1::ReadFile& req,
                                const std::function<bool(const std::string& canonical)>& allowed) {
  v1::FileChunk c;
  c.set_request_id(req.request_id());
  c.set_offset(req.offset());
  std::error_code ec;
  if (req.path().empty() || req.path()[0] != '/') {
    c.set_error("path: must be absolute");
    return c;
  }
  const std::string path = std::filesystem::canonical(req.path(), ec).string();
  if (ec) {
    c.set_error(absl::StrCat(req.path(), ": ", ec.message()));
    return c;
  }
  if (!allowed(path)) {
    c.set_error(absl::StrCat(req.path(), ": not a file this worker serves (outside its work dir and "
                                         "--checkpoint-root, and not reported by its ranks)"));
    return c;
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    c.set_error(absl::StrCat(req.path(), ": not a regular file"));
    return c;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    c.set_error(absl::StrCat(req.path(), ": cannot open"));
    return c;
  }
  c.set_size(st.st_size);
  if (req.offset() < 0 || req.offset() > st.st_size) {
    c.set_error(absl::StrCat("offset: ", req.offset(), " is outside the file (", st.st_size, " bytes)"));
    return c;
  }
  std::vector<char> buf(kMaxFileChunkBytes);
  if (req.want_checksum()) {
    uLong crc = crc32(0L, Z_NULL, 0);
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      if (in.gcount() > 0) crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(in.gcount()));
    }
    c.set_checksum(absl::StrFormat("crc32:%08x", static_cast<uint32_t>(crc)));
    in.clear();
  }
  const int64_t want = std::min<int64_t>({std::max(req.max_bytes(), 1), kMaxFileChunkBytes, st.st_size - req.offset()});
  in.seekg(req.offset());
  std::string data(static_cast<size_t>(want), '\0');
  in.read(data.data(), want);
  if (in.gcount() != want) {
    c.set_error(absl::StrCat(req.path(), ": short read at ", req.offset(), " (the file changed?)"));
    return c;
  }
  c.set_data(std::move(data));
  return c;
}

}  // namespace trainctl::worker
