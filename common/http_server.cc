#include "common/http_server.h"

// Debian's libcpp-httplib is compiled with OpenSSL: the trainctl_httplib
// target defines CPPHTTPLIB_OPENSSL_SUPPORT for every file that includes
// the header, or the classes it declares would not match the library's.
#include <httplib.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/http_request.h"

namespace trainctl {

namespace {

void Send(const HttpServer::Reply& r, httplib::Response& res) {
  res.status = r.status;
  for (const auto& [name, value] : r.headers) res.set_header(name, value);
  res.set_content(r.body, r.content_type.c_str());
}

}  // namespace

std::string HttpServer::Request::Header(const std::string& name) const {
  for (const auto& [key, value] : headers) {
    if (key.size() == name.size() &&
        std::equal(key.begin(), key.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) ==
                 std::tolower(static_cast<unsigned char>(b));
        })) {
      return value;
    }
  }
  return "";
}

std::string HttpServer::Request::Param(const std::string& name) const {
  auto it = params.find(name);
  return it == params.end() ? "" : it->second;
}

const std::vector<std::pair<std::string, std::string>>& HttpServer::SecurityHeaders() {
  static const auto* const kHeaders = new std::vector<std::pair<std::string, std::string>>{
      {"Content-Security-Policy",
       "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src "
       "'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"},
      {"X-Frame-Options", "DENY"},
      {"X-Content-Type-Options", "nosniff"},
      {"Referrer-Policy", "same-origin"},
  };
  return *kHeaders;
}

HttpServer::HttpServer() : server_(std::make_unique<httplib::Server>()) { Configure(); }

void HttpServer::Configure() {
  // Short requests: a scraper every few seconds, a dashboard polling once a
  // second. A fixed pool; idle keep-alive connections give their thread
  // back after 2 s.
  server_->new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
  server_->set_keep_alive_timeout(2);
  // Forms (the dashboard's login) are small.
  server_->set_payload_max_length(64 << 10);
  httplib::Headers headers;
  for (const auto& [name, value] : SecurityHeaders()) headers.emplace(name, value);
  if (tls_) headers.emplace("Strict-Transport-Security", "max-age=31536000");
  server_->set_default_headers(std::move(headers));
}

absl::Status HttpServer::EnableTls(const std::string& cert_pem, const std::string& key_pem) {
  std::string error;
  auto setup = [&](SSL_CTX& ctx) {
    auto fail = [&](const char* what) {
      error = absl::StrCat(what, ": ", ERR_error_string(ERR_get_error(), nullptr));
      return false;
    };
    BIO* cert_bio = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
    X509* cert = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
    bool ok = cert != nullptr && SSL_CTX_use_certificate(&ctx, cert) == 1;
    X509_free(cert);
    // The rest of the PEM: intermediate certificates, sent along.
    while (ok) {
      X509* extra = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
      if (extra == nullptr) break;
      if (SSL_CTX_add_extra_chain_cert(&ctx, extra) != 1) {
        X509_free(extra);
        ok = false;
      }
    }
    ERR_clear_error();  // the end of the PEM reads as an error
    BIO_free(cert_bio);
    if (!ok) return fail("certificate");
    BIO* key_bio = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
    EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
    BIO_free(key_bio);
    ok = key != nullptr && SSL_CTX_use_PrivateKey(&ctx, key) == 1 &&
         SSL_CTX_check_private_key(&ctx) == 1;
    EVP_PKEY_free(key);
    if (!ok) return fail("private key");
    SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
    return true;
  };
  auto server = std::make_unique<httplib::SSLServer>(setup);
  if (!server->is_valid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HTTPS: cannot use the TLS certificate and key: ", error.empty() ? "invalid" : error));
  }
  server_ = std::move(server);
  tls_ = true;
  Configure();
  return absl::OkStatus();
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Handle(const std::string& path, Handler handler) {
  server_->Get(path,
               [handler = std::move(handler)](const httplib::Request&, httplib::Response& res) {
                 Send(handler(), res);
               });
}

void HttpServer::HandleRequest(const std::string& method, const std::string& pattern,
                               RequestHandler handler) {
  auto serve = [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    Request r;
    r.method = req.method;
    r.path = req.path;
    r.remote_addr = req.remote_addr;
    for (size_t i = 1; i < req.matches.size(); ++i) r.matches.push_back(req.matches[i].str());
    r.params.insert(req.params.begin(), req.params.end());
    r.headers.insert(req.headers.begin(), req.headers.end());
    r.body = req.body;
    if (req.method == "POST" &&
        req.get_header_value("Content-Type").rfind("application/x-www-form-urlencoded", 0) == 0) {
      std::multimap<std::string, std::string> form = http::ParseUrlEncoded(req.body);
      r.params.insert(form.begin(), form.end());
    }
    Send(handler(r), res);
  };
  if (method == "POST") {
    server_->Post(pattern, std::move(serve));
  } else {
    server_->Get(pattern, std::move(serve));
  }
}

absl::StatusOr<std::string> HttpServer::Start(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-listen: '", listen, "' is not HOST:PORT"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  int bound = port == 0 ? server_->bind_to_any_port(host.c_str())
                        : (server_->bind_to_port(host.c_str(), port) ? port : -1);
  if (bound <= 0)
    return absl::UnavailableError(absl::StrCat("--http-listen: cannot listen on ", listen));
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // httplib's stop() does nothing before the accept loop runs (and the
  // thread would then never end): return only once it runs.
  for (absl::Time deadline = absl::Now() + absl::Seconds(5);
       !server_->is_running() && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::StrCat(listen.substr(0, colon), ":", bound);
}

void HttpServer::Stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

}  // namespace trainctl
