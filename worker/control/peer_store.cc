// worker/control/peer_store.cc
#include "worker/control/peer_store.h"

#include "worker/objstore/object_key.h"

namespace tidal::worker {
namespace {

// "shard-00002-of-00004.safetensors" (or a buddy copy's "part-00002-of-00004.json") → {1, 4}.
bool ParseRankedName(std::string_view name, std::string_view kPrefix, std::string_view kSuffix,
                     size_t* index, size_t* count) {
  constexpr std::string_view kOf = "-of-";
  if (name.size() != kPrefix.size() + 5 + kOf.size() + 5 + kSuffix.size()) return false;
  if (name.substr(0, kPrefix.size()) != kPrefix) return false;
  if (name.substr(kPrefix.size() + 5, kOf.size()) != kOf) return false;
  if (name.substr(name.size() - kSuffix.size()) != kSuffix) return false;
  auto number = [](std::string_view digits, size_t* out) {
    size_t v = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + static_cast<size_t>(c - '0');
    }
    *out = v;
    return true;
  };
  size_t one_based = 0;
  if (!number(name.substr(kPrefix.size(), 5), &one_based) || one_based == 0) return false;
  if (!number(name.substr(kPrefix.size() + 5 + kOf.size(), 5), count)) return false;
  *index = one_based - 1;
  return *index < *count;
}

}  // namespace

PeerStore::PeerStore(std::vector<std::string> peers, const contract::ClientOptions& client)
    : peers_(std::move(peers)) {
  for (const std::string& peer : peers_) {
    contract::ClientOptions options = client;
    options.address = peer;
    clients_.push_back(std::make_unique<contract::WorkerClient>(options));
  }
}

std::string PeerStore::uri() const {
  std::string out = "peers://";
  for (size_t i = 0; i < peers_.size(); ++i) out += (i ? "," : "") + peers_[i];
  return out;
}

StatusOr<size_t> PeerStore::Owner(const std::string& key) const {
  TIDAL_RETURN_IF_ERROR(objstore::ValidateKey(key));
  if (peers_.empty()) return FailedPrecondition(uri() + ": no peers");
  const auto slash = key.rfind('/');
  const std::string_view name =
      slash == std::string::npos ? std::string_view(key) : std::string_view(key).substr(slash + 1);
  size_t index = 0, count = 0;
  if (!ParseRankedName(name, "shard-", ".safetensors", &index, &count) &&
      !ParseRankedName(name, "part-", ".json", &index, &count))
    return size_t{0};
  if (count != peers_.size())
    return FailedPrecondition(uri() + ": \"" + key + "\" is a shard of " + std::to_string(count) +
                              " ranks, but the previous generation had " +
                              std::to_string(peers_.size()));
  return index;
}

Status PeerStore::Put(const std::string& key, std::string_view) {
  return FailedPrecondition(uri() + ": read-only (putting \"" + key + "\")");
}

Status PeerStore::Delete(const std::vector<std::string>&) {
  return FailedPrecondition(uri() + ": read-only");
}

StatusOr<std::vector<objstore::ObjectInfo>> PeerStore::List(const std::string& prefix) {
  return FailedPrecondition(uri() + ": cannot list \"" + prefix +
                            "\": the Rendezvous names the step to read");
}

StatusOr<std::string> PeerStore::Get(const std::string& key) {
  TIDAL_ASSIGN_OR_RETURN(size_t owner, Owner(key));
  std::string out;
  auto size = clients_[owner]->ReadState(key, 0, 0, /*to_end=*/true, &out);
  if (!size.ok()) return size.status().WithContext(peers_[owner]);
  if (out.size() != *size)
    return DataLoss(peers_[owner] + ": \"" + key + "\" came with " + std::to_string(out.size()) +
                    " of its " + std::to_string(*size) + " bytes");
  return out;
}

StatusOr<std::string> PeerStore::GetRange(const std::string& key, uint64_t offset,
                                          uint64_t length) {
  TIDAL_ASSIGN_OR_RETURN(size_t owner, Owner(key));
  std::string out;
  auto size = clients_[owner]->ReadState(key, offset, length, /*to_end=*/false, &out);
  if (!size.ok()) return size.status().WithContext(peers_[owner]);
  if (out.size() != length)
    return DataLoss(peers_[owner] + ": range of \"" + key + "\" came with " +
                    std::to_string(out.size()) + " of " + std::to_string(length) + " bytes");
  return out;
}

StatusOr<uint64_t> PeerStore::Size(const std::string& key) {
  TIDAL_ASSIGN_OR_RETURN(size_t owner, Owner(key));
  auto size = clients_[owner]->ReadState(key, 0, 0, /*to_end=*/false, nullptr);
  if (!size.ok()) return size.status().WithContext(peers_[owner]);
  return size;
}

}  // namespace tidal::worker
