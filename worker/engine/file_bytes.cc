#include "worker/engine/file_bytes.h"

#include <zlib.h>

#include <algorithm>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include <sys/stat.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainctl::engine {

absl::StatusOr<std::vector<char>> ReadFileBytes(const std::string& path, absl::string_view what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(what, " '", path, "' does not exist"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' cannot be read: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' is not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' cannot be opened"));
  }
  std::vector<char> bytes(static_cast<size_t>(st.st_size));
  if (!bytes.empty() && !in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) {
    return absl::InternalError(absl::StrCat("reading ", what, " '", path, "' failed"));
  }
  return bytes;
}

bool IsGzip(const std::vector<char>& bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

absl::StatusOr<std::vector<char>> Gunzip(const std::vector<char>& compressed,
                                         const std::string& path, size_t max_bytes,
                                         bool prefix_only) {
  std::vector<char> out;
  out.reserve(std::min(compressed.size() * 4, max_bytes));
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
    return absl::InternalError("zlib inflateInit2 failed");
  }
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  zs.avail_in = static_cast<uInt>(compressed.size());
  char chunk[1 << 16];
  int rc = Z_OK;
  while (true) {
    zs.next_out = reinterpret_cast<Bytef*>(chunk);
    zs.avail_out = sizeof(chunk);
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) break;
    out.insert(out.end(), chunk, chunk + (sizeof(chunk) - zs.avail_out));
    if (out.size() >= max_bytes && prefix_only) {
      out.resize(max_bytes);
      inflateEnd(&zs);
      return out;
    }
    if (out.size() > max_bytes) {
      inflateEnd(&zs);
      return absl::InvalidArgumentError(absl::StrCat("gzip file '", path,
                                                     "' inflates to more than the ", max_bytes,
                                                     " bytes its header declares"));
    }
    if (rc == Z_STREAM_END) {
      if (zs.avail_in == 0) break;
      inflateReset(&zs);  // another gzip member follows
      continue;
    }
    if (zs.avail_in == 0 && zs.avail_out != 0) {
      rc = Z_BUF_ERROR;  // input ended inside a member: truncated
      break;
    }
  }
  const std::string zlib_msg = zs.msg != nullptr ? absl::StrCat(": ", zs.msg) : std::string();
  inflateEnd(&zs);
  if (rc != Z_STREAM_END) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gzip file '", path, "' is corrupt or truncated (zlib code ", rc, zlib_msg, ")"));
  }
  return out;
}

}  // namespace trainctl::engine
