// trainctl token create|list|revoke, and trainctl login (writes the config
// file the other verbs read). See docs/cli.md and docs/security.md.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/cli/context.h"
#include "client/cli/format.h"
#include "common/auth/secret.h"
#include "common/coordinator_failover.h"

namespace trainctl::cli {

namespace {

std::string RoleText(v1::Role r) {
  switch (r) {
    case v1::ROLE_ADMIN:
      return "admin";
    case v1::ROLE_SUBMITTER:
      return "submitter";
    case v1::ROLE_VIEWER:
      return "viewer";
    case v1::ROLE_WORKER:
      return "worker";
    case v1::ROLE_JOIN:
      return "join";
    default:
      return "-";
  }
}

// "24h", "90m", "7d", "1h30m"; "0" or "" = never expires.
absl::StatusOr<absl::Duration> ParseTtl(const std::string& text) {
  if (text.empty() || text == "0") return absl::ZeroDuration();
  absl::Duration d;
  int64_t days = 0;
  if (absl::EndsWith(text, "d") && absl::SimpleAtoi(text.substr(0, text.size() - 1), &days) &&
      days > 0) {
    return absl::Hours(24 * days);
  }
  if (!absl::ParseDuration(text, &d) || d < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ttl: '", text, "' is not a duration such as 24h, 90m or 7d"));
  }
  return d;
}

struct CreateArgs {
  std::string role;
  std::string name;
  std::string ttl;
  std::vector<std::string> addresses;
  std::vector<std::string> queues;
};

int RunCreate(CliContext& ctx, const CreateArgs& a) {
  v1::CreateTokenRequest req;
  std::string role = absl::AsciiStrToLower(a.role);
  if (role == "admin")
    req.set_role(v1::ROLE_ADMIN);
  else if (role == "submitter")
    req.set_role(v1::ROLE_SUBMITTER);
  else if (role == "viewer")
    req.set_role(v1::ROLE_VIEWER);
  else if (role == "worker")
    req.set_role(v1::ROLE_WORKER);
  else if (role == "join")
    req.set_role(v1::ROLE_JOIN);
  else {
    return ctx.Fail(absl::InvalidArgumentError(absl::StrCat(
        "--role: '", a.role, "' is not one of admin, submitter, viewer, worker, join")));
  }
  absl::StatusOr<absl::Duration> ttl = ParseTtl(a.ttl);
  if (!ttl.ok()) return ctx.Fail(ttl.status());
  req.mutable_ttl()->set_seconds(absl::ToInt64Seconds(*ttl));
  req.set_name(a.name);
  req.set_one_time(req.role() == v1::ROLE_JOIN);
  for (const std::string& addr : a.addresses) {
    if (!addr.empty()) req.add_addresses(addr);
  }
  for (const std::string& q : a.queues) {
    if (!q.empty()) req.add_queues(q);
  }
  return ConnectCallPrint(
      ctx, [&](Client& client) { return client.CreateToken(req); },
      [&](v1::CreateTokenResponse& r) -> int {
        if (ctx.json()) {
          ctx.PrintJson(r);
          return kExitOk;
        }
        ctx.out << "token " << r.token().id() << " (" << r.token().name() << "), role "
                << RoleText(r.token().role()) << ", expires "
                << (r.token().has_expire_time() ? FormatTimestamp(r.token().expire_time())
                                                : "never")
                << (r.token().one_time() ? ", one-time" : "")
                << (r.token().addresses_size() > 0
                        ? absl::StrCat(", addresses ", absl::StrJoin(r.token().addresses(), ","))
                        : "")
                << (r.token().queues_size() > 0
                        ? absl::StrCat(", queues ", absl::StrJoin(r.token().queues(), ","))
                        : "")
                << "\n"
                << "secret (shown once; the coordinator keeps only its hash):\n"
                << r.secret() << "\n";
        return kExitOk;
      });
}

int RunList(CliContext& ctx, bool all) {
  return ConnectCallPrint(
      ctx, [&](Client& client) { return client.ListTokens(all); },
      [&](std::vector<v1::Token>& tokens) -> int {
        if (ctx.json()) return PrintJsonList(ctx, tokens, &v1::ListTokensResponse::mutable_tokens);
        if (tokens.empty()) {
          ctx.out << (all ? "no tokens\n"
                          : "no live tokens (--all shows revoked and expired ones)\n");
          return kExitOk;
        }
        Table t({"ID", "NAME", "ROLE", "CREATED", "EXPIRES", "STATE"});
        for (const v1::Token& tok : tokens) {
          std::string state = "active";
          if (tok.revoked())
            state = "revoked";
          else if (tok.one_time() && tok.used())
            state = "used";
          else if (tok.has_expire_time() &&
                   absl::Now() >= absl::FromUnixSeconds(tok.expire_time().seconds()))
            state = "expired";
          else if (tok.one_time())
            state = "one-time";
          t.AddRow({tok.id(), tok.name(), RoleText(tok.role()), FormatTimestamp(tok.create_time()),
                    tok.has_expire_time() ? FormatTimestamp(tok.expire_time()) : "never", state});
        }
        t.Print(ctx.out);
        return kExitOk;
      });
}

int RunRevoke(CliContext& ctx, const std::string& id) {
  return ConnectCallPrint(
      ctx, [&](Client& client) { return client.RevokeToken(id); },
      [&](v1::Token& t) -> int {
        if (ctx.json()) {
          ctx.PrintJson(t);
          return kExitOk;
        }
        ctx.out << "token " << t.id() << " (" << t.name() << ") revoked\n";
        return kExitOk;
      });
}

int RunLogin(CliContext& ctx, const std::string& address) {
  std::string addr = address.empty() ? ctx.coordinator_flag : address;
  if (addr.empty()) return ctx.Fail(absl::InvalidArgumentError("--address: required (host:port)"));
  if (absl::StatusOr<std::vector<std::string>> list =
          ParseCoordinatorList(addr, address.empty() ? "--coordinator" : "--address");
      !list.ok()) {
    return ctx.Fail(list.status());
  }
  if (ctx.token_flag.empty())
    return ctx.Fail(absl::InvalidArgumentError("--token-file (or --token): required"));
  std::string ca;
  if (!ctx.ca_flag.empty()) {
    std::error_code ec;
    ca = std::filesystem::absolute(ctx.ca_flag, ec).string();
    if (!std::filesystem::exists(ca, ec)) {
      return ctx.Fail(
          absl::InvalidArgumentError(absl::StrCat("--ca: ", ctx.ca_flag, ": no such file")));
    }
  }
  std::string path = ConfigFilePath(ctx.env);
  if (path.empty())
    return ctx.Fail(
        absl::InvalidArgumentError("config file: neither $XDG_CONFIG_HOME nor $HOME is set"));
  // Check the token before saving it: a mistyped one fails here, not later.
  ClientOptions options;
  options.address = addr;
  options.token = ctx.token_flag;
  options.ca_file = ca;
  options.timeout = absl::Seconds(ctx.timeout_s);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return ctx.Fail(client.status());
  absl::StatusOr<std::vector<v1::Worker>> probe = (*client)->Workers(false);
  if (!probe.ok() && probe.status().code() != absl::StatusCode::kPermissionDenied) {
    return ctx.Fail(probe.status());
  }
  std::string yaml = absl::StrCat("# Written by `trainctl login`.\ncoordinator: \"", addr,
                                  "\"\ntoken: \"", ctx.token_flag, "\"\n");
  if (!ca.empty()) absl::StrAppend(&yaml, "ca: \"", ca, "\"\n");
  absl::Status w = auth::WritePrivateFile(path, yaml);
  if (!w.ok()) return ctx.Fail(w);
  ctx.out << "logged in to " << addr << (ca.empty() ? " (plaintext)" : " (TLS)") << "; wrote "
          << path << "\n";
  return kExitOk;
}

}  // namespace

VerbRunner AddTokenVerb(CLI::App& app, CliContext& ctx) {
  CLI::App* sub =
      AddVerb(app, "token", "Create, list and revoke bearer tokens (admin)",
              "  trainctl token create --role submitter --name alice --ttl 30d\n"
              "  trainctl token create --role submitter --name team-a --queues team-a,shared\n"
              "  trainctl token create --role worker --name gpu-07\n"
              "  trainctl token create --role join --ttl 1h --address 10.0.3.7 --name gpu-07\n"
              "                                     (one-time: trainctl-worker --join-token)\n"
              "  trainctl token list --all\n"
              "  trainctl token revoke t-3f9a1c0d\n",
              "Examples:");
  sub->require_subcommand(1, 1);
  auto create = std::make_shared<CreateArgs>();
  auto all = std::make_shared<bool>(false);
  auto id = std::make_shared<std::string>();
  auto which = std::make_shared<std::string>();
  CLI::App* c = sub->add_subcommand("create", "Create a token and print its secret once");
  c->add_option("--role", create->role,
                "admin, submitter, viewer, worker, or join (one-time: a new worker's certificate)")
      ->required();
  c->add_option("--name", create->name, "Who or what holds it (default: its id)");
  c->add_option("--ttl", create->ttl,
                "Lifetime, e.g. 24h, 90m, 7d (default: never expires; join tokens 24h)");
  c->add_option("--address", create->addresses,
                "Join and worker tokens: a host name or IP address the worker may be reached at "
                "(repeat or comma-separate). A joined worker's certificate names only these; its "
                "rendezvous reports may name only these or the IP it connects from")
      ->delimiter(',')
      ->type_name("HOST");
  c->add_option(
       "--queues", create->queues,
       "Submitter and admin tokens: the queues it may submit to (comma-separated, at most 16); the "
       "first is where a job naming none goes. A submitter token is refused other queues. Queues "
       "need not exist yet")
      ->delimiter(',')
      ->type_name("QUEUE");
  c->callback([which] { *which = "create"; });
  CLI::App* l = sub->add_subcommand("list", "List tokens (never their secrets)");
  l->add_flag("--all", *all, "Include revoked, expired and used tokens");
  l->callback([which] { *which = "list"; });
  CLI::App* r = sub->add_subcommand("revoke", "Revoke a token at once");
  r->add_option("id", *id, "Token id (trainctl token list)")->required();
  r->callback([which] { *which = "revoke"; });
  return [&ctx, create, all, id, which] {
    if (*which == "create") return RunCreate(ctx, *create);
    if (*which == "list") return RunList(ctx, *all);
    return RunRevoke(ctx, *id);
  };
}

int RunWorkerRevoke(CliContext& ctx, const std::string& id) {
  return ConnectCallPrint(
      ctx, [&](Client& client) { return client.RevokeWorker(id); },
      [&](v1::RevokeWorkerResponse& r) -> int {
        if (ctx.json()) {
          ctx.PrintJson(r);
          return kExitOk;
        }
        ctx.out << "worker " << r.worker_id()
                << (r.newly_revoked() ? " revoked" : " was already revoked") << " at "
                << FormatTimestamp(r.revoke_time())
                << (r.serials_size() > 0 ? absl::StrCat(" (certificate serials ",
                                                        absl::StrJoin(r.serials(), ","), ")")
                                         : "")
                << "; a token worker keeps its token: revoke that too (trainctl token revoke)\n";
        return kExitOk;
      });
}

VerbRunner AddWorkerVerb(CLI::App& app, CliContext& ctx) {
  CLI::App* sub = AddVerb(app, "worker", "Manage one worker (admin): revoke its certificate",
                          "  trainctl worker revoke w-3f9a1c0d2b4e\n", "Examples:");
  sub->require_subcommand(1, 1);
  auto id = std::make_shared<std::string>();
  CLI::App* r = sub->add_subcommand(
      "revoke",
      "Revoke a worker's certificate at once: its session ends, its ranks are rescheduled");
  r->add_option("id", *id, "Worker id (trainctl workers)")->required();
  return [&ctx, id] { return RunWorkerRevoke(ctx, *id); };
}

// The dashboard's one-time sign-in link: the host this CLI dialed, the
// port and scheme the coordinator's dashboard listens with.
int RunDashboard(CliContext& ctx) {
  return ConnectCallPrint(
      ctx, [&](Client& client) { return client.CreateSignInCode(); },
      [&](Client& client, v1::CreateSignInCodeResponse& r) -> int {
        // The coordinator that made the code: the active one.
        const std::string address = client.active_address();
        std::string host = address.substr(0, address.rfind(':'));
        if (absl::StartsWith(host, "dns:///")) host = host.substr(7);
        if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
        if (host == "[::]") host = "[::1]";
        const std::string url = absl::StrCat(r.https() ? "https" : "http", "://", host, ":",
                                             r.http_port(), "/signin?code=", r.code());
        if (ctx.json()) {
          ctx.out << "{\"url\":\"" << url << "\",\"expires_in_s\":" << r.expires_in_s() << "}\n";
          return kExitOk;
        }
        ctx.out << url << "\n";
        ctx.err << "open it within " << r.expires_in_s()
                << " s; it signs one browser in with your token, once\n";
        return kExitOk;
      });
}

VerbRunner AddDashboardVerb(CLI::App& app, CliContext& ctx) {
  AddVerb(app, "dashboard", "Print a one-time link that opens the dashboard signed in (valid 60 s)",
          "  trainctl dashboard                  # https://coord:8443/signin?code=...\n"
          "  chromium --headless --screenshot \"$(trainctl dashboard)\"\n");
  return [&ctx] { return RunDashboard(ctx); };
}

VerbRunner AddLoginVerb(CLI::App& app, CliContext& ctx) {
  auto address = std::make_shared<std::string>();
  CLI::App* sub = AddVerb(
      app, "login",
      "Check a token against a coordinator and save address, token and CA in the config file",
      "  trainctl login --address coord:7070 --token-file alice.token --ca ca.crt\n"
      "Writes $XDG_CONFIG_HOME (or ~/.config)/trainctl/config.yaml with mode 0600. Without --ca\n"
      "only a loopback address is accepted (the token would cross the network in clear text).\n");
  sub->add_option("--address", *address, "Coordinator HOST:PORT, or a comma-separated list of them")
      ->type_name("HOST:PORT[,...]");
  return [&ctx, address] { return RunLogin(ctx, *address); };
}

}  // namespace trainctl::cli
