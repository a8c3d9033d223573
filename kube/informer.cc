// kube/informer.cc
#include "kube/informer.h"

#include <algorithm>

#include "common/log.h"

namespace tidal::kube {
namespace {

using nlohmann::json;

const json& Metadata(const json& object) {
  static const json kEmpty = json::object();
  auto it = object.find("metadata");
  return it != object.end() && it->is_object() ? *it : kEmpty;
}

std::string StringField(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// --- Memory estimate (glibc malloc on 64-bit: 8 bytes of header, 16-byte granules, 32 min).
size_t Chunk(size_t request) { return std::max<size_t>(32, (request + 8 + 15) & ~size_t{15}); }
size_t StringHeap(const std::string& s) {
  return s.capacity() > 15 ? Chunk(s.capacity() + 1) : 0;  // beyond the small-string buffer
}
// sizeof a std::map / std::set node's header: colour + parent, left, right.
constexpr size_t kTreeNodeHeader = 32;

// The heap a json value owns (not counting the json object itself, which its parent holds).
size_t JsonHeap(const json& j) {
  switch (j.type()) {
    case json::value_t::object: {
      size_t n = Chunk(sizeof(json::object_t));
      for (const auto& [key, value] : j.get_ref<const json::object_t&>())
        n += Chunk(kTreeNodeHeader + sizeof(std::string) + sizeof(json)) + StringHeap(key) +
             JsonHeap(value);
      return n;
    }
    case json::value_t::array: {
      const auto& a = j.get_ref<const json::array_t&>();
      size_t n = Chunk(sizeof(json::array_t));
      if (a.capacity() > 0) n += Chunk(a.capacity() * sizeof(json));
      for (const auto& v : a) n += JsonHeap(v);
      return n;
    }
    case json::value_t::string:
      return Chunk(sizeof(std::string)) + StringHeap(j.get_ref<const std::string&>());
    case json::value_t::binary:
      return Chunk(sizeof(json::binary_t)) + j.get_binary().capacity();
    default:
      return 0;
  }
}

// make_shared<const json>: one allocation holding the control block and the json.
size_t ObjectBytes(const json& object) { return Chunk(16 + sizeof(json)) + JsonHeap(object); }
// One items_ entry besides its object: the tree node (key + Entry) and a long key's buffer.
size_t EntryOverhead(const std::string& key) {
  return Chunk(kTreeNodeHeader + sizeof(std::string) + 24) + StringHeap(key);
}
// One key in one index value's set.
constexpr size_t kIndexKeyBytes = 48;  // Chunk(kTreeNodeHeader + sizeof(pointer))
// One distinct index value: the hash node (next, key, set, cached hash) and a long value's buffer.
size_t IndexValueBytes(const std::string& value) {
  return Chunk(8 + sizeof(std::string) + 48 + 8) + StringHeap(value);
}

std::vector<std::string> NamespaceValues(const json& object) {
  std::string ns = StringField(Metadata(object), "namespace");
  if (ns.empty()) return {};
  return {ns};
}

std::vector<std::string> LabelValues(const json& object) {
  std::vector<std::string> out;
  auto it = Metadata(object).find("labels");
  if (it == Metadata(object).end() || !it->is_object()) return out;
  for (const auto& [k, v] : it->items())
    if (v.is_string()) out.push_back(k + "=" + v.get<std::string>());
  return out;
}

std::vector<std::string> OwnerValues(const json& object, bool controller_only) {
  std::vector<std::string> out;
  auto it = Metadata(object).find("ownerReferences");
  if (it == Metadata(object).end() || !it->is_array()) return out;
  for (const auto& ref : *it) {
    if (!ref.is_object()) continue;
    std::string uid = StringField(ref, "uid");
    if (uid.empty()) continue;
    auto c = ref.find("controller");
    if (controller_only && !(c != ref.end() && c->is_boolean() && c->get<bool>())) continue;
    if (std::find(out.begin(), out.end(), uid) == out.end()) out.push_back(uid);
  }
  return out;
}

std::vector<std::string> Distinct(std::vector<std::string> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

}  // namespace

std::string ObjectKey(const std::string& ns, const std::string& name) {
  return ns.empty() ? name : ns + "/" + name;
}

std::string ObjectKey(const json& object) {
  const json& m = Metadata(object);
  return ObjectKey(StringField(m, "namespace"), StringField(m, "name"));
}

void StripManagedFields(json& object) {
  auto it = object.find("metadata");
  if (it == object.end() || !it->is_object()) return;
  it->erase("managedFields");
  auto annotations = it->find("annotations");
  if (annotations == it->end() || !annotations->is_object()) return;
  annotations->erase("kubectl.kubernetes.io/last-applied-configuration");
  if (annotations->empty()) it->erase(annotations);
}

Store::Store() {
  indexes_[kNamespaceIndex].func = NamespaceValues;
  indexes_[kLabelIndex].func = LabelValues;
  indexes_[kOwnerIndex].func = [](const json& o) { return OwnerValues(o, false); };
  indexes_[kControllerIndex].func = [](const json& o) { return OwnerValues(o, true); };
}

Status Store::AddIndex(const std::string& name, IndexFunc func) {
  if (!func) return InvalidArgument("index \"" + name + "\": no index function");
  std::lock_guard<std::mutex> lock(mu_);
  if (indexes_.count(name)) return InvalidArgument("index \"" + name + "\" exists already");
  Index& index = indexes_[name];
  index.func = std::move(func);
  for (const auto& [key, entry] : items_) IndexLocked(index, &key, *entry.object);
  return OkStatus();
}

void Store::IndexLocked(Index& index, const std::string* key, const json& object) {
  for (const std::string& value : Distinct(index.func(object))) {
    auto [it, created] = index.by_value.try_emplace(value);
    if (created) bytes_ += IndexValueBytes(value);
    if (it->second.insert(key).second) bytes_ += kIndexKeyBytes;
  }
}

void Store::UnindexLocked(Index& index, const std::string* key, const json& object) {
  for (const std::string& value : Distinct(index.func(object))) {
    auto it = index.by_value.find(value);
    if (it == index.by_value.end()) continue;
    if (it->second.erase(key)) bytes_ -= kIndexKeyBytes;
    if (it->second.empty()) {
      bytes_ -= IndexValueBytes(it->first);
      index.by_value.erase(it);
    }
  }
}

std::optional<StoreChange> Store::Apply(ObjectEvent event) {
  const std::string key = ObjectKey(event.object);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = items_.find(key);
  if (event.type == ObjectEvent::kDeleted) {
    if (it == items_.end()) return std::nullopt;
    ObjectPtr held = it->second.object;
    for (auto& [name, index] : indexes_) UnindexLocked(index, &it->first, *held);
    bytes_ -= EntryOverhead(it->first) + it->second.bytes;
    items_.erase(it);
    // A watch DELETED carries the final state; a relist's deletion only the metadata.
    bool full = event.object.is_object() && event.object.size() > 1;
    ObjectPtr last = full ? std::make_shared<const json>(std::move(event.object)) : held;
    return StoreChange{ObjectEvent::kDeleted, held, last};
  }
  auto object = std::make_shared<const json>(std::move(event.object));
  const size_t object_bytes = ObjectBytes(*object);
  if (it == items_.end()) {
    it = items_.emplace(key, Entry{object, object_bytes}).first;
    bytes_ += EntryOverhead(it->first) + object_bytes;
    for (auto& [name, index] : indexes_) IndexLocked(index, &it->first, *object);
    return StoreChange{ObjectEvent::kAdded, nullptr, object};
  }
  ObjectPtr old = it->second.object;
  for (auto& [name, index] : indexes_) {
    // Most updates (status) leave labels and owners alone: touch the index only on a change.
    if (Distinct(index.func(*old)) == Distinct(index.func(*object))) continue;
    UnindexLocked(index, &it->first, *old);
    IndexLocked(index, &it->first, *object);
  }
  bytes_ = bytes_ - it->second.bytes + object_bytes;
  it->second = Entry{object, object_bytes};
  return StoreChange{ObjectEvent::kModified, old, object};
}

ObjectPtr Store::GetByKey(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = items_.find(key);
  return it == items_.end() ? nullptr : it->second.object;
}

ObjectPtr Store::Get(const std::string& ns, const std::string& name) const {
  return GetByKey(ObjectKey(ns, name));
}

std::vector<ObjectPtr> Store::ObjectsLocked(const KeySet& keys) const {
  std::vector<ObjectPtr> out;
  out.reserve(keys.size());
  for (const std::string* key : keys) out.push_back(items_.at(*key).object);
  return out;
}

std::vector<ObjectPtr> Store::List(const std::string& ns) const {
  if (!ns.empty()) return ByIndex(kNamespaceIndex, ns);
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ObjectPtr> out;
  out.reserve(items_.size());
  for (const auto& [key, entry] : items_) out.push_back(entry.object);
  return out;
}

std::vector<std::string> Store::ListKeys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.reserve(items_.size());
  for (const auto& [key, entry] : items_) out.push_back(key);
  return out;
}

std::vector<ObjectPtr> Store::ByIndex(const std::string& name, const std::string& value) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto index = indexes_.find(name);
  if (index == indexes_.end()) return {};
  auto it = index->second.by_value.find(value);
  if (it == index->second.by_value.end()) return {};
  return ObjectsLocked(it->second);
}

std::vector<ObjectPtr> Store::ByLabel(const std::string& key, const std::string& value) const {
  return ByIndex(kLabelIndex, key + "=" + value);
}

std::vector<ObjectPtr> Store::ByOwner(const std::string& uid) const {
  return ByIndex(kOwnerIndex, uid);
}

std::vector<ObjectPtr> Store::ByController(const std::string& uid) const {
  return ByIndex(kControllerIndex, uid);
}

std::vector<ObjectPtr> Store::Select(const LabelSelector& selector, const std::string& ns) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Candidates: the smallest label-index set of an equality requirement, else the namespace's
  // objects, else everything.
  const KeySet* narrowest = nullptr;
  static const KeySet kNone;
  const auto& labels = indexes_.at(kLabelIndex).by_value;
  for (const auto& req : selector.requirements()) {
    if (req.op != LabelRequirement::kEquals) continue;
    auto it = labels.find(req.key + "=" + req.values.front());
    const KeySet* set = it == labels.end() ? &kNone : &it->second;
    if (!narrowest || set->size() < narrowest->size()) narrowest = set;
  }
  if (!narrowest && !ns.empty()) {
    const auto& namespaces = indexes_.at(kNamespaceIndex).by_value;
    auto it = namespaces.find(ns);
    narrowest = it == namespaces.end() ? &kNone : &it->second;
  }
  std::vector<ObjectPtr> out;
  auto consider = [&](const ObjectPtr& object) {
    const json& m = Metadata(*object);
    if (!ns.empty() && StringField(m, "namespace") != ns) return;
    auto labels_it = m.find("labels");
    if (selector.Matches(labels_it == m.end() ? json() : *labels_it)) out.push_back(object);
  };
  if (narrowest) {
    for (const std::string* key : *narrowest) consider(items_.at(*key).object);
  } else {
    for (const auto& [key, entry] : items_) consider(entry.object);
  }
  return out;
}

std::vector<std::string> Store::IndexValues(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  auto index = indexes_.find(name);
  if (index == indexes_.end()) return out;
  for (const auto& [value, keys] : index->second.by_value) out.push_back(value);
  std::sort(out.begin(), out.end());
  return out;
}

size_t Store::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return items_.size();
}

size_t Store::ApproximateBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

Informer::Informer(KubeClient& client, InformerOptions options)
    : client_(client), options_(std::move(options)) {}

Informer::~Informer() { Stop(); }

Status Informer::AddEventHandler(EventHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_)
    return FailedPrecondition("informer for " + options_.resource.plural +
                              ": add event handlers before Start");
  handlers_.push_back(std::move(handler));
  return OkStatus();
}

Status Informer::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_ || stopped_)
    return FailedPrecondition("informer for " + options_.resource.plural +
                              ": already started or stopped");
  // Refuse what the server would refuse on every retry.
  TIDAL_RETURN_IF_ERROR(LabelSelector::Parse(options_.label_selector).status());
  ListOptions list;
  list.label_selector = options_.label_selector;
  TIDAL_RETURN_IF_ERROR(ListRequest(options_.resource, options_.namespace_, list).status());
  started_ = true;
  WatcherOptions watch;
  watch.resource = options_.resource;
  watch.namespace_ = options_.namespace_;
  watch.label_selector = options_.label_selector;
  watch.initial_backoff = options_.initial_backoff;
  watch.max_backoff = options_.max_backoff;
  watch.idle_timeout = options_.idle_timeout;
  watch.on_listed = [this] { OnListed(); };
  watcher_ = std::make_unique<Watcher>(
      client_, std::move(watch), [this](const ObjectEvent& e) { OnEvent(e); },
      WatcherCore::KeepingVersionsOnly());
  return OkStatus();
}

void Informer::Stop() {
  std::unique_ptr<Watcher> watcher;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    watcher = std::move(watcher_);
    synced_cv_.notify_all();
  }
  if (watcher) watcher->Stop();  // joins its thread: no handler runs after this returns
}

bool Informer::WaitForSync(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  synced_cv_.wait_for(lock, timeout, [&] { return synced_.load() || stopped_; });
  return synced_.load();
}

int Informer::relists() const {
  std::lock_guard<std::mutex> lock(mu_);
  return watcher_ ? watcher_->relists() : 0;
}

void Informer::OnEvent(const ObjectEvent& event) {
  if (options_.observe) options_.observe(event.type, event.object);
  ObjectEvent copy = event;
  if (options_.transform) options_.transform(copy.object);
  std::optional<StoreChange> change = store_.Apply(std::move(copy));
  if (!change) return;
  // handlers_ is fixed once started, so it is read here without the lock.
  for (const auto& h : handlers_) {
    switch (change->type) {
      case ObjectEvent::kAdded:
        if (h.on_add) h.on_add(change->object);
        break;
      case ObjectEvent::kModified:
        if (h.on_update) h.on_update(change->old_object, change->object);
        break;
      case ObjectEvent::kDeleted:
        if (h.on_delete) h.on_delete(change->object);
        break;
    }
  }
}

void Informer::OnListed() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!synced_.exchange(true))
    LogInfo("informer synced",
            {{"resource", options_.resource.plural}, {"objects", store_.size()}});
  synced_cv_.notify_all();
}

}  // namespace tidal::kube
