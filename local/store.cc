// local/store.cc
#include "local/store.h"

#include <sqlite3.h>

#include <algorithm>
#include <filesystem>

namespace tidal::local {
namespace {

constexpr const char* kTooOld = "too old resource version";

class Statement {
 public:
  Statement(sqlite3* db, const char* sql) { sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Statement() { sqlite3_finalize(stmt_); }
  sqlite3_stmt* get() { return stmt_; }
  Statement& Bind(int i, const std::string& s) {
    sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  int Step() { return sqlite3_step(stmt_); }
  std::string Text(int i) {
    auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, i));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(stmt_, i))) : "";
  }
  int64_t Int(int i) { return sqlite3_column_int64(stmt_, i); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string message = err ? err : "unknown";
    sqlite3_free(err);
    return Unavailable(std::string("storage: ") + message);
  }
  return OkStatus();
}

}  // namespace

const char* EventTypeName(WatchEvent::Type type) {
  switch (type) {
    case WatchEvent::kAdded:
      return "ADDED";
    case WatchEvent::kModified:
      return "MODIFIED";
    case WatchEvent::kDeleted:
      return "DELETED";
  }
  return "UNKNOWN";
}

StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& dir, size_t history_size) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return InvalidArgument("--data: cannot create " + dir + ": " + ec.message());
  sqlite3* db = nullptr;
  std::string path = dir + "/store.db";
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    std::string why = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Unavailable("opening " + path + ": " + why);
  }
  std::unique_ptr<Store> store(new Store(db, history_size < 1 ? 1 : history_size));
  // WAL + synchronous=FULL: a commit is on disk (fsync of the log) before it returns.
  TIDAL_RETURN_IF_ERROR(Exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"));
  TIDAL_RETURN_IF_ERROR(
      Exec(db,
           "CREATE TABLE IF NOT EXISTS objects(key TEXT PRIMARY KEY, resource TEXT,"
           " namespace TEXT, name TEXT, rv INTEGER, body TEXT);"
           "CREATE TABLE IF NOT EXISTS history(rv INTEGER PRIMARY KEY, type INTEGER,"
           " resource TEXT, namespace TEXT, name TEXT, body TEXT);"
           "CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v INTEGER);"));
  TIDAL_RETURN_IF_ERROR(store->Load());
  return store;
}

Store::~Store() { sqlite3_close(db_); }

Status Store::Load() {
  {
    Statement s(db_, "SELECT k, v FROM meta");
    while (s.Step() == SQLITE_ROW) {
      if (s.Text(0) == "version") version_ = s.Int(1);
      if (s.Text(0) == "compacted") compacted_ = s.Int(1);
    }
  }
  auto parse = [](const std::string& body, const std::string& what) -> StatusOr<nlohmann::json> {
    auto json = nlohmann::json::parse(body, nullptr, false);
    if (json.is_discarded()) return DataLoss("storage: corrupt JSON for " + what);
    return json;
  };
  {
    Statement s(db_, "SELECT resource, namespace, name, body FROM objects");
    while (s.Step() == SQLITE_ROW) {
      ObjectKey key{s.Text(0), s.Text(1), s.Text(2)};
      TIDAL_ASSIGN_OR_RETURN(nlohmann::json body, parse(s.Text(3), key.ToString()));
      objects_[key] = std::make_shared<const nlohmann::json>(std::move(body));
    }
  }
  {
    Statement s(db_,
                "SELECT rv, type, resource, namespace, name, body FROM history WHERE rv > ?1 "
                "ORDER BY rv");
    s.Bind(1, compacted_);
    while (s.Step() == SQLITE_ROW) {
      ObjectKey key{s.Text(2), s.Text(3), s.Text(4)};
      TIDAL_ASSIGN_OR_RETURN(nlohmann::json body, parse(s.Text(5), key.ToString()));
      history_.push_back(WatchEvent{static_cast<WatchEvent::Type>(s.Int(1)), s.Int(0), key,
                                    std::make_shared<const nlohmann::json>(std::move(body))});
    }
  }
  return OkStatus();
}

int64_t Store::CurrentVersion() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}

int64_t Store::OldestWatchableVersion() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compacted_;
}

ObjectPtr Store::Get(const ObjectKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(key);
  return it == objects_.end() ? nullptr : it->second;
}

std::vector<ObjectPtr> Store::List(const std::string& resource,
                                   const std::string& namespace_) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ObjectPtr> out;
  ObjectKey from{resource, namespace_, ""};
  for (auto it = objects_.lower_bound(from); it != objects_.end(); ++it) {
    if (it->first.resource != resource) break;
    if (!namespace_.empty() && it->first.namespace_ != namespace_) break;
    out.push_back(it->second);
  }
  return out;
}

StatusOr<ObjectPtr> Store::Create(const ObjectKey& key, nlohmann::json object) {
  return Write(WatchEvent::kAdded, key, std::move(object), std::nullopt);
}

StatusOr<ObjectPtr> Store::Update(const ObjectKey& key, nlohmann::json object,
                                  const std::optional<int64_t>& expected_version) {
  return Write(WatchEvent::kModified, key, std::move(object), expected_version);
}

StatusOr<ObjectPtr> Store::Delete(const ObjectKey& key,
                                  const std::optional<int64_t>& expected_version) {
  return Write(WatchEvent::kDeleted, key, std::nullopt, expected_version);
}

StatusOr<ObjectPtr> Store::Write(WatchEvent::Type type, const ObjectKey& key,
                                 std::optional<nlohmann::json> object,
                                 const std::optional<int64_t>& expected_version) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(key);
  if (type == WatchEvent::kAdded && it != objects_.end()) return AlreadyExists("already exists");
  if (type != WatchEvent::kAdded && it == objects_.end()) return NotFound("not found");
  // Compare-and-swap under the same lock as the write.
  if (expected_version &&
      (*it->second)["metadata"].value("resourceVersion", "") != std::to_string(*expected_version))
    return Aborted("the object has been modified");
  int64_t version = version_ + 1;
  nlohmann::json stored = type == WatchEvent::kDeleted ? *it->second : std::move(*object);
  stored["metadata"]["resourceVersion"] = std::to_string(version);
  std::string body = stored.dump();

  bool trim = ++writes_since_trim_ >= static_cast<int64_t>(history_size_ / 4 + 1);
  int64_t new_compacted = compacted_;
  if (trim && history_.size() + 1 > history_size_)
    new_compacted = history_[history_.size() + 1 - history_size_ - 1].resource_version;

  TIDAL_RETURN_IF_ERROR(Exec(db_, "BEGIN IMMEDIATE"));
  auto fail = [&](const std::string& what) {
    std::string why = sqlite3_errmsg(db_);
    Exec(db_, "ROLLBACK").ok();
    return Unavailable("storage: " + what + ": " + why);
  };
  if (type == WatchEvent::kDeleted) {
    Statement s(db_, "DELETE FROM objects WHERE key = ?1");
    if (s.Bind(1, key.ToString()).Step() != SQLITE_DONE) return fail("delete");
  } else {
    Statement s(
        db_,
        "INSERT INTO objects(key, resource, namespace, name, rv, body) VALUES(?1,?2,?3,?4,?5,?6)"
        " ON CONFLICT(key) DO UPDATE SET rv = excluded.rv, body = excluded.body");
    s.Bind(1, key.ToString()).Bind(2, key.resource).Bind(3, key.namespace_).Bind(4, key.name);
    s.Bind(5, version).Bind(6, body);
    if (s.Step() != SQLITE_DONE) return fail("write");
  }
  {
    Statement s(db_,
                "INSERT INTO history(rv, type, resource, namespace, name, body) "
                "VALUES(?1,?2,?3,?4,?5,?6)");
    s.Bind(1, version).Bind(2, static_cast<int64_t>(type)).Bind(3, key.resource);
    s.Bind(4, key.namespace_).Bind(5, key.name).Bind(6, body);
    if (s.Step() != SQLITE_DONE) return fail("history");
  }
  {
    Statement s(db_,
                "INSERT INTO meta(k, v) VALUES('version', ?1), ('compacted', ?2) "
                "ON CONFLICT(k) DO UPDATE SET v = excluded.v");
    if (s.Bind(1, version).Bind(2, new_compacted).Step() != SQLITE_DONE) return fail("meta");
  }
  if (new_compacted != compacted_) {
    Statement s(db_, "DELETE FROM history WHERE rv <= ?1");
    if (s.Bind(1, new_compacted).Step() != SQLITE_DONE) return fail("compact");
  }
  if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) return fail("commit");

  // Committed: now the in-memory view.
  version_ = version;
  if (trim) writes_since_trim_ = 0;
  while (!history_.empty() && history_.front().resource_version <= new_compacted)
    history_.pop_front();
  compacted_ = new_compacted;
  auto ptr = std::make_shared<const nlohmann::json>(std::move(stored));
  if (type == WatchEvent::kDeleted) {
    objects_.erase(it);
  } else {
    objects_[key] = ptr;
  }
  history_.push_back(WatchEvent{type, version, key, ptr});
  changed_.notify_all();
  return ptr;
}

StatusOr<Store::Changes> Store::EventsAfter(int64_t after_version, const std::string& resource,
                                            std::chrono::milliseconds wait) const {
  std::unique_lock<std::mutex> lock(mu_);
  auto collect = [&]() -> StatusOr<Changes> {
    if (after_version < compacted_)
      return Expired(std::string(kTooOld) + ": " + std::to_string(after_version) +
                     " (oldest available: " + std::to_string(compacted_) + ")");
    Changes out;
    out.scanned_to = std::max(after_version, version_);
    // Versions are dense in history_ except across deletes of compacted entries: binary search.
    auto it =
        std::upper_bound(history_.begin(), history_.end(), after_version,
                         [](int64_t v, const WatchEvent& e) { return v < e.resource_version; });
    for (; it != history_.end(); ++it)
      if (resource.empty() || it->key.resource == resource) out.events.push_back(*it);
    return out;
  };
  auto first = collect();
  if (!first.ok() || !first->events.empty()) return first;
  int64_t seen = version_;
  changed_.wait_for(lock, wait, [&] { return version_ != seen || woken_; });
  return collect();
}

void Store::WakeWatchers() {
  std::lock_guard<std::mutex> lock(mu_);
  woken_ = true;
  changed_.notify_all();
}

}  // namespace tidal::local
