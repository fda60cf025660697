// The RPC -> roles table (method_roles.h) covers every method of every
// trainctl.v1 service and nothing else, and docs/security.md prints it as
// it is.
#include "coordinator/auth/method_roles.h"

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/auth/token_authority.h"
#include "tests/support/source_dir.h"
#include "trainctl/v1/auth.grpc.pb.h"
#include "trainctl/v1/job_service.grpc.pb.h"
#include "trainctl/v1/queue.grpc.pb.h"
#include "trainctl/v1/worker_service.grpc.pb.h"

namespace trainctl::coordinator {
namespace {

std::string RoleWord(v1::Role r) {
  std::string name = v1::Role_Name(r);  // ROLE_ADMIN
  std::string word = name.substr(5);
  for (char& c : word) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return word;
}

TEST(MethodRolesTest, EveryMethodOfEveryServiceHasRolesAndEveryRowIsAMethod) {
  // Every service of the four API files (a message of each links its
  // descriptors in), so a new service is covered too.
  std::set<std::string> methods;
  for (const google::protobuf::FileDescriptor* file :
       {v1::SubmitJobRequest::descriptor()->file(), v1::WorkerMessage::descriptor()->file(),
        v1::CreateTokenRequest::descriptor()->file(),
        v1::CreateQueueRequest::descriptor()->file()}) {
    ASSERT_GT(file->service_count(), 0) << file->name();
    for (int s = 0; s < file->service_count(); ++s) {
      const google::protobuf::ServiceDescriptor* d = file->service(s);
      for (int i = 0; i < d->method_count(); ++i) {
        methods.insert(absl::StrCat(d->full_name(), "/", d->method(i)->name()));
      }
    }
  }
  std::set<std::string> rows;
  std::set<std::string> names;
  for (const MethodRoles& m : AllMethodRoles()) {
    EXPECT_TRUE(rows.insert(absl::StrCat(m.service, "/", m.method)).second) << m.method << " twice";
    EXPECT_TRUE(names.insert(std::string(m.method)).second)
        << m.method << ": names must be unique across services";
    EXPECT_FALSE(m.roles.empty()) << m.method;
    EXPECT_EQ(RolesOf(m.method).size(), m.roles.size()) << m.method;
  }
  EXPECT_EQ(rows, methods) << "a method without roles, or a row without a method";
  EXPECT_TRUE(RolesOf("NoSuchMethod").empty());
}

TEST(MethodRolesTest, TheDocsTableIsTheTable) {
  std::ifstream in(trainctl::testing::SourceDir() + "/docs/security.md");
  ASSERT_TRUE(in) << "docs/security.md";
  // | `JobService.SubmitJob` | admin, submitter |
  const std::regex row(R"(^\| `(\w+)\.(\w+)` \| ([a-z, ]+) \|$)");
  std::map<std::string, std::string> docs;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_match(line, m, row))
      docs[absl::StrCat("trainctl.v1.", m[1].str(), "/", m[2].str())] = m[3];
  }
  std::map<std::string, std::string> table;
  for (const MethodRoles& m : AllMethodRoles()) {
    std::vector<std::string> words;
    for (v1::Role r : m.roles) words.push_back(RoleWord(r));
    table[absl::StrCat(m.service, "/", m.method)] = absl::StrJoin(words, ", ");
  }
  EXPECT_EQ(docs, table)
      << "docs/security.md \"Who may call what\" differs from coordinator/auth/method_roles.cc";
}

TEST(MethodRolesTest, AuthorizeRefusesARoleTheTableDoesNotList) {
  Principal viewer;
  viewer.role = v1::ROLE_VIEWER;
  viewer.token_id = "t-1";
  absl::Status s = TokenAuthority::Authorize(viewer, "SubmitJob", RolesOf("SubmitJob"));
  EXPECT_TRUE(absl::IsPermissionDenied(s));
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("SubmitJob needs role admin or submitter"));
  EXPECT_TRUE(TokenAuthority::Authorize(viewer, "GetJob", RolesOf("GetJob")).ok());
}

}  // namespace
}  // namespace trainctl::coordinator
