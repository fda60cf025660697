#include "coordinator/server/health_service.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace trainctl::coordinator {

namespace {
constexpr char kCheck[] = "/grpc.health.v1.Health/Check";
constexpr char kWatch[] = "/grpc.health.v1.Health/Watch";
constexpr int kServing = 1;
constexpr int kNotServing = 2;
}  // namespace

bool HealthService::ParseRequest(const std::string& bytes, std::string* service) {
  using google::protobuf::internal::WireFormatLite;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  service->clear();
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return in.ConsumedEntireMessage();
    if (WireFormatLite::GetTagFieldNumber(tag) == 1 &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!WireFormatLite::ReadString(&in, service)) return false;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return false;
    }
  }
}

std::string HealthService::Response(int status) {
  // HealthCheckResponse{status = 1}: tag (1 << 3 | varint) then the enum.
  return std::string{static_cast<char>(0x08), static_cast<char>(status)};
}

// One call: Check reads its request and answers it; anything else is
// refused at once.
class HealthService::Call final : public grpc::ServerGenericBidiReactor {
 public:
  Call(HealthService* owner, grpc::GenericCallbackServerContext* ctx) : owner_(owner) {
    if (ctx->method() == kCheck) {
      StartRead(&request_);
      return;
    }
    Finish(grpc::Status(
        grpc::StatusCode::UNIMPLEMENTED,
        ctx->method() == kWatch
            ? "grpc.health.v1.Health/Watch is not served by trainctl's coordinator; use Check"
            : "unknown method"));
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Check: no request"));
      return;
    }
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (request_.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices)
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    std::string service;
    if (!ParseRequest(bytes, &service)) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "Check: the HealthCheckRequest does not parse"));
      return;
    }
    const std::vector<std::string>& known = owner_->services_;
    if (!service.empty() && std::find(known.begin(), known.end(), service) == known.end()) {
      Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service"));
      return;
    }
    const std::string answer = Response(owner_->serving_() ? kServing : kNotServing);
    grpc::Slice slice(answer);
    response_ = grpc::ByteBuffer(&slice, 1);
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void OnDone() override { delete this; }

 private:
  HealthService* owner_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
};

grpc::ServerGenericBidiReactor* HealthService::CreateReactor(
    grpc::GenericCallbackServerContext* ctx) {
  return new Call(this, ctx);
}

}  // namespace trainctl::coordinator
