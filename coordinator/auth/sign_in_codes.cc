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

void SignInCodes::PruneLocked() {
  const absl::Time now = clock_->Mono();
  absl::erase_if(codes_, [&](const auto& kv) { return kv.second.expires <= now; });
  while (codes_.size() >= kMaxCodes) {
    auto oldest = std::min_element(codes_.begin(), codes_.end(), [](const auto& a, const auto& b) {
      return a.second.expires < b.second.expires;
    });
    codes_.erase(oldest);
  }
}

std::string SignInCodes::Create(const std::string& secret) {
  std::string code = NewSecretHex();
  absl::MutexLock lock(&mu_);
  PruneLocked();
  codes_[code] = Entry{secret, clock_->Mono() + kTtl};
  return code;
}

absl::StatusOr<std::string> SignInCodes::Redeem(const std::string& code) {
  absl::MutexLock lock(&mu_);
  auto it = codes_.find(code);
  if (it == codes_.end()) return absl::NotFoundError("this sign-in link is unknown or was used already");
  Entry e = std::move(it->second);
  codes_.erase(it);
  if (e.expires <= clock_->Mono()) return absl::NotFoundError("this sign-in link has expired (links last 60 s)");
  return std::move(e.secret);
}

}  // namespace trainctl::coordinator
