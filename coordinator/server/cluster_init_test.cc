#include "coordinator/server/cluster_init.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "common/auth/pki.h"
#include "common/auth/secret.h"
#include "common/temp_dir.h"
#include "coordinator/store/state_store.h"

namespace trainctl::coordinator {
namespace {

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

ClusterInitOptions OptionsIn(const std::string& root) {
  ClusterInitOptions o;
  o.dir = root + "/tls";
  o.sans = {"trainer-1.example"};
  o.join_tokens = 2;
  o.listen = "0.0.0.0:7171";
  o.store_spec = "sqlite:" + root + "/trainctl.db";
  o.store_flag_text = " --db " + root + "/trainctl.db";
  return o;
}

TEST(ClusterInitTest, WritesTheClusterFilesPrivateExceptTheCertificates) {
  const ScopedTempDir tmp("cluster_init_test");
  const std::string& root = tmp.path();
  ASSERT_FALSE(root.empty());
  const ClusterInitOptions o = OptionsIn(root);
  ASSERT_EQ(RunClusterInit(o), 0);
  EXPECT_EQ(ModeOf(o.dir), 0700u);
  for (const char* name : {"ca.key", "coordinator.key", "admin.token", "worker.token",
                           "join-1.token", "join-2.token", "trainctl.yaml"}) {
    EXPECT_EQ(ModeOf(o.dir + "/" + name), 0600u) << name;
  }
  for (const char* name : {"ca.crt", "coordinator.crt"})
    EXPECT_EQ(ModeOf(o.dir + "/" + name), 0644u) << name;
  EXPECT_FALSE(std::filesystem::exists(o.dir + "/join-3.token"));
  // The CLI config names the first --san and --listen's port.
  absl::StatusOr<std::string> config = auth::ReadFile(o.dir + "/trainctl.yaml");
  ASSERT_TRUE(config.ok());
  EXPECT_NE(config->find("coordinator: \"trainer-1.example:7171\""), std::string::npos) << *config;
  // The worker token went into the store the options name.
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::OpenSpec(o.store_spec);
  ASSERT_TRUE(store.ok()) << store.status();
}

TEST(ClusterInitTest, RefusesToReplaceTheCaAndNamesABadStoreOrTtl) {
  const ScopedTempDir tmp("cluster_init_test");
  const std::string& root = tmp.path();
  ASSERT_FALSE(root.empty());
  ClusterInitOptions o = OptionsIn(root);
  ASSERT_EQ(RunClusterInit(o), 0);
  absl::StatusOr<std::string> ca = auth::ReadFile(o.dir + "/ca.key");
  ASSERT_TRUE(ca.ok());
  EXPECT_EQ(RunClusterInit(o), 1);
  EXPECT_EQ(*auth::ReadFile(o.dir + "/ca.key"), *ca) << "the cluster CA was replaced";

  ClusterInitOptions no_dir = OptionsIn(root);
  no_dir.dir.clear();
  EXPECT_EQ(RunClusterInit(no_dir), 2);

  ClusterInitOptions bad_store = OptionsIn(root);
  bad_store.dir = root + "/tls2";
  bad_store.store_spec_error = "--store and --db: give one";
  EXPECT_EQ(RunClusterInit(bad_store), 1);

  ClusterInitOptions bad_ttl = OptionsIn(root);
  bad_ttl.dir = root + "/tls3";
  bad_ttl.join_ttl_h = 0;
  EXPECT_EQ(RunClusterInit(bad_ttl), 1);
}

TEST(ClusterInitTest, WorkerCertNamesTheWorker) {
  const ScopedTempDir tmp("cluster_init_test");
  const std::string& root = tmp.path();
  ASSERT_FALSE(root.empty());
  const ClusterInitOptions o = OptionsIn(root);
  ASSERT_EQ(RunClusterInit(o), 0);
  EXPECT_EQ(RunWorkerCert({o.dir, "gpu-7", root, {"gpu-7.example"}}), 0);
  EXPECT_EQ(ModeOf(root + "/gpu-7.key"), 0600u);
  absl::StatusOr<std::string> cert = auth::ReadFile(root + "/gpu-7.crt");
  ASSERT_TRUE(cert.ok());
  absl::StatusOr<std::string> cn = auth::CertCommonName(*cert);
  ASSERT_TRUE(cn.ok()) << cn.status();
  EXPECT_EQ(*cn, "gpu-7");
  // No CA in --dir: a usage error.
  EXPECT_EQ(RunWorkerCert({root + "/nowhere", "gpu-7", root, {}}), 2);
  EXPECT_EQ(RunWorkerCert({o.dir, "", root, {}}), 2);
}

}  // namespace
}  // namespace trainctl::coordinator
