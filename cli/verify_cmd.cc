// `patchstore verify STORE [--json]` — recompute every record's checksum of a
// store, or of every shard of a set (and check the set); exit 3 on damage.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/json.h"
#include "cli/progress.h"
#include "patchstore/reader/reader.h"
#include "patchstore/reader/verify.h"

namespace patchstore::cli {
namespace {

struct VerifyArgs {
  std::string store;
  bool json = false;
};

int RunVerify(const VerifyArgs& a) {
  std::vector<std::string> set = StoresIn(a.store);
  Result<VerifyReport> r = Status::Internal("not verified");
  if (set.empty()) {
    r = VerifyStore(a.store);
  } else {
    // The set first (each shard once, ids unique), then every store; a
    // problem names its store.
    auto whole = Reader::OpenSet(set);
    if (!whole.ok()) return Fail(whole.status());
    VerifyReport all;
    for (size_t i = 0; i < (*whole)->store_count(); ++i) {
      const std::string& store = (*whole)->store_path(i);
      auto one = VerifyStore(store);
      if (!one.ok()) return Fail(one.status().WithContext("verifying shard '" + store + "'"));
      all.samples += one->samples;
      all.records += one->records;
      all.bytes += one->bytes;
      for (VerifyProblem p : one->problems) {
        p.message = "in '" + store + "': " + p.message;
        all.problems.push_back(std::move(p));
      }
    }
    r = std::move(all);
  }
  if (!r.ok()) return Fail(r.status());
  const VerifyReport& rep = *r;
  if (a.json) {
    std::cout << "{\"ok\": " << (rep.ok() ? "true" : "false") << ", \"samples\": " << rep.samples
              << ", \"records\": " << rep.records << ", \"bytes\": " << rep.bytes << ", \"problems\": [";
    for (size_t i = 0; i < rep.problems.size(); ++i)
      std::cout << (i ? ", " : "") << "{\"id\": " << JsonString(rep.problems[i].id)
                << ", \"field\": " << JsonString(rep.problems[i].field)
                << ", \"message\": " << JsonString(rep.problems[i].message) << "}";
    std::cout << "]}\n";
  } else {
    for (const auto& p : rep.problems) {
      // A problem of the sample or the store (no field): no "field ''".
      const std::string where = (p.id.empty() ? std::string("store") : "'" + Printable(p.id) + "'") +
                                (p.field.empty() ? std::string() : " field '" + Printable(p.field) + "'");
      std::printf("BAD  %s: %s\n", where.c_str(), p.message.c_str());
    }
    std::printf("%s: %llu samples, %llu records, %s checked, %zu problem%s\n", rep.ok() ? "OK" : "DAMAGED",
                static_cast<unsigned long long>(rep.samples), static_cast<unsigned long long>(rep.records),
                HumanBytes(static_cast<double>(rep.bytes)).c_str(), rep.problems.size(),
                rep.problems.size() == 1 ? "" : "s");
  }
  return rep.ok() ? 0 : 3;
}

}  // namespace

Runner RegisterVerify(CLI::App* app, const bool* /*quiet*/) {
  auto* cmd = app->add_subcommand("verify", "Recompute every checksum; exit 3 and name each damaged record");
  auto args = std::make_shared<VerifyArgs>();
  cmd->add_option("STORE", args->store,
                  "Store directory, or a directory of shards (every shard is verified, and the set checked: "
                  "each shard once, no id in two shards)")
      ->required();
  cmd->add_flag("--json", args->json, "Machine-readable output");
  AddExitCodes(cmd, "0 no damage found, 1 the store could not be opened (the message says why), 2 bad usage, 3 "
                    "damage found (each damaged record named).");
  return [cmd, args]() -> int { return cmd->parsed() ? RunVerify(*args) : -1; };
}

}  // namespace patchstore::cli
