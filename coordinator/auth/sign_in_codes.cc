#include "coordinator/auth/sign_in_codes.h"

#include <algorithm>

#include "common/random_secret.h"

namespace trainctl::coordinator {

void SignInCodes::SetEndpoint(Endpoint e) {
  absl::MutexLock lock(&mu_);
  endpoint_ = e;
}

SignInCodes::Endpoint SignInCodes::endpoint() const {
  absl::MutexLock lock(&mu_);
  return endpoint_;
}

void SignInCodes::DropOldestLocked(const std::string& secret) {
  auto oldest = codes_.end();
  for (auto it = codes_.begin(); it != codes_.end(); ++it) {
    if (it->second.secret == secret &&
        (oldest == codes_.end() || it->second.expires < oldest->second.expires)) {
      oldest = it;
    }
  }
  if (oldest == codes_.end()) return;
  codes_.erase(oldest);
  if (--per_secret_[secret] == 0) per_secret_.erase(secret);
}

void SignInCodes::PruneLocked(const std::string& secret) {
  const absl::Time now = clock_->Mono();
  for (auto it = codes_.begin(); it != codes_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    if (--per_secret_[it->second.secret] == 0) per_secret_.erase(it->second.secret);
    codes_.erase(it++);
  }
  while (per_secret_.contains(secret) && per_secret_[secret] >= kMaxPerToken)
    DropOldestLocked(secret);
  while (codes_.size() >= kMaxCodes) {
    auto most = std::max_element(per_secret_.begin(), per_secret_.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    DropOldestLocked(most->first);
  }
}

std::string SignInCodes::Create(const std::string& secret) {
  std::string code = NewSecretHex();
  absl::MutexLock lock(&mu_);
  PruneLocked(secret);
  codes_[code] = Entry{secret, clock_->Mono() + kTtl};
  ++per_secret_[secret];
  return code;
}

absl::StatusOr<std::string> SignInCodes::Redeem(const std::string& code) {
  absl::MutexLock lock(&mu_);
  auto it = codes_.find(code);
  if (it == codes_.end())
    return absl::NotFoundError("this sign-in link is unknown or was used already");
  Entry e = std::move(it->second);
  codes_.erase(it);
  if (--per_secret_[e.secret] == 0) per_secret_.erase(e.secret);
  if (e.expires <= clock_->Mono())
    return absl::NotFoundError("this sign-in link has expired (links last 60 s)");
  return std::move(e.secret);
}

}  // namespace trainctl::coordinator
