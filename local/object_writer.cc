// local/object_writer.cc
#include "local/object_writer.h"

#include <chrono>
#include <ctime>
#include <random>
#include <set>

#include "common/base64.h"
#include "common/yaml_json.h"
#include "kube/meta_time.h"
#include "kube/request.h"
#include "local/json_fields.h"
#include "local/schema.h"

namespace tidal::local {
namespace {

using nlohmann::json;

std::string NowRfc3339(std::chrono::seconds offset = std::chrono::seconds(0)) {
  return kube::FormatTime(std::chrono::system_clock::now() + offset);
}

std::mt19937_64& Rng() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return rng;
}

std::string NewUid() {
  std::uniform_int_distribution<uint64_t> dist;
  uint64_t a = dist(Rng()), b = dist(Rng());
  a = (a & 0xffffffffffff0fffULL) | 0x0000000000004000ULL;  // version 4
  b = (b & 0x3fffffffffffffffULL) | 0x8000000000000000ULL;  // RFC 4122 variant
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(a >> 32),
                static_cast<unsigned>((a >> 16) & 0xffff), static_cast<unsigned>(a & 0xffff),
                static_cast<unsigned>(b >> 48),
                static_cast<unsigned long long>(b & 0xffffffffffffULL));
  return buf;
}

// As apiserver's names.SimpleNameGenerator: 5 characters without vowels or look-alikes.
std::string RandomSuffix() {
  static const char kAlphabet[] = "bcdfghjklmnpqrstvwxz2456789";
  std::uniform_int_distribution<size_t> dist(0, sizeof(kAlphabet) - 2);
  std::string out;
  for (int i = 0; i < 5; ++i) out.push_back(kAlphabet[dist(Rng())]);
  return out;
}

json& Meta(json& object) {
  if (!object.contains("metadata") || !object["metadata"].is_object())
    object["metadata"] = json::object();
  return object["metadata"];
}

std::string MetaString(const json& object, const char* field) {
  if (!object.is_object() || !object.contains("metadata") || !object["metadata"].is_object())
    return "";
  const json& m = object["metadata"];
  return m.contains(field) && m[field].is_string() ? m[field].get<std::string>() : "";
}

std::vector<std::string> Finalizers(const json& object) {
  std::vector<std::string> out;
  if (object.contains("metadata") && object["metadata"].contains("finalizers") &&
      object["metadata"]["finalizers"].is_array())
    for (const auto& f : object["metadata"]["finalizers"])
      if (f.is_string()) out.push_back(f);
  return out;
}

// The parts of an object whose change bumps metadata.generation: everything but metadata (and
// status, when it has its own subresource), as the apiserver's strategies do.
json GenerationRelevant(json object, bool status_subresource) {
  object.erase("metadata");
  if (status_subresource) object.erase("status");
  return object;
}

std::optional<int64_t> ParseVersion(const std::string& text) {
  if (text.empty()) return std::nullopt;
  try {
    size_t used = 0;
    int64_t v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (...) {
  }
  return std::nullopt;
}

// ".spec.replicas" → "/spec/replicas"
json::json_pointer Pointer(const std::string& path) {
  std::string p = path;
  for (auto& c : p)
    if (c == '.') c = '/';
  return json::json_pointer(p);
}

bool OwnedBy(const json& object, const std::string& uid) {
  if (!object.contains("metadata") || !object["metadata"].contains("ownerReferences")) return false;
  for (const auto& ref : object["metadata"]["ownerReferences"])
    if (ref.is_object() && ref.value("uid", "") == uid) return true;
  return false;
}

std::string NameInvalidMessage(const std::string& name) {
  return "Invalid value: \"" + name +
         "\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
         "'-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
         "regex used for validation is "
         "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
}

}  // namespace

std::optional<ResourceInfo> ObjectWriter::ResourceOf(const ObjectKey& key) const {
  for (const auto& r : registry_.All())
    if (r.storage_resource() == key.resource) return r;
  return std::nullopt;
}

void ObjectWriter::RegisterStoredCrds() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  for (const auto& crd : store_.List("apiextensions.k8s.io/customresourcedefinitions", "")) {
    auto resources = Registry::ResourcesOfCrd(*crd);
    if (resources.ok()) registry_.AddCrd(MetaString(*crd, "name"), std::move(*resources));
  }
}

std::optional<ApiError> ObjectWriter::Admit(const ResourceInfo& r, const std::string& name,
                                            json& object, const WriteOptions& options,
                                            std::vector<std::string>& warnings) {
  std::vector<FieldCause> causes;
  if (r.kind == "Secret" && (!object.contains("type") || object["type"] == "")) {
    object["type"] = "Opaque";  // the Secret strategy's default
  }
  if (r.kind == "Secret" && object.contains("stringData")) {
    // As the Secret strategy: stringData is write-only, merged into data (base64) on write.
    if (!object["stringData"].is_object()) {
      causes.push_back({"FieldValueInvalid", "stringData", "Invalid value: expected an object"});
    } else {
      for (const auto& [k, v] : object["stringData"].items()) {
        if (!v.is_string())
          causes.push_back(
              {"FieldValueInvalid", "stringData." + k, "Invalid value: expected a string"});
        else
          object["data"][k] = Base64Encode(v.get<std::string>());
      }
      object.erase("stringData");
    }
  }
  if (!kube::ValidateObjectName(name).ok())
    causes.push_back({"FieldValueInvalid", "metadata.name", NameInvalidMessage(name)});
  const json& meta = object["metadata"];
  for (const char* map_field : {"labels", "annotations"}) {
    if (!meta.contains(map_field)) continue;
    bool ok = meta[map_field].is_object() || meta[map_field].is_null();
    if (ok && meta[map_field].is_object())
      for (const auto& [k, v] : meta[map_field].items()) ok = ok && v.is_string();
    if (!ok)
      causes.push_back({"FieldValueTypeInvalid", std::string("metadata.") + map_field,
                        "Invalid value: expected a map of strings to strings"});
  }
  if (r.custom && r.schema.is_object()) {
    SchemaResult result = ApplySchema(r.schema, object);
    if (!result.unknown_fields.empty()) {
      if (options.field_validation == "Strict") {
        std::string list;
        for (const auto& f : result.unknown_fields) {
          if (!list.empty()) list += ", ";
          list += "unknown field \"" + f + "\"";
        }
        return BadRequest(r.kind + " in version \"" + r.version + "\" cannot be handled as a " +
                          r.kind + ": strict decoding error: " + list);
      }
      if (options.field_validation == "Warn")
        for (const auto& f : result.unknown_fields)
          warnings.push_back("unknown field \"" + f + "\"");
    }
    causes.insert(causes.end(), result.errors.begin(), result.errors.end());
  }
  if (r.kind == "CustomResourceDefinition" && causes.empty()) {
    auto resources = Registry::ResourcesOfCrd(object);
    if (!resources.ok()) {
      const std::string& m = resources.status().message();
      size_t colon = m.find(": ");
      causes.push_back({"FieldValueInvalid", m.substr(0, colon),
                        colon == std::string::npos ? m : m.substr(colon + 2)});
    } else if (registry_.Conflicts(name, *resources)) {
      causes.push_back({"FieldValueInvalid", "spec.names",
                        "Invalid value: the kind or plural is already served in this group"});
    }
  }
  if (!causes.empty()) return InvalidError(r, name, causes);
  return std::nullopt;
}

// The Priority admission plugin (plugin/pkg/admission/priority): a new pod's spec.priority is
// its PriorityClass's value (spec.priorityClassName), else the globalDefault class's, else 0;
// a class that does not exist is refused, and so is a priority given that differs from it.
std::optional<ApiError> ObjectWriter::AdmitPriority(const ResourceInfo& r, const std::string& name,
                                                    json& pod) {
  if (!pod.contains("spec") || !pod["spec"].is_object()) return std::nullopt;
  json& spec = pod["spec"];
  const std::optional<ResourceInfo> classes =
      registry_.Find("scheduling.k8s.io", "v1", "priorityclasses");
  const std::string class_name = StringField(spec, "priorityClassName");
  int64_t value = 0;
  std::string from;
  auto value_of = [](const json& c) {
    return c.contains("value") && c["value"].is_number_integer() ? c["value"].get<int64_t>() : 0;
  };
  if (!class_name.empty()) {
    ObjectPtr c = classes ? store_.Get(Key(*classes, "", class_name)) : nullptr;
    if (!c)
      return ApiError{403, "Forbidden",
                      r.plural + " \"" + name + "\" is forbidden: no PriorityClass with name " +
                          class_name + " was found",
                      Details(r, name)};
    value = value_of(*c);
    from = class_name;
  } else if (classes) {
    for (const ObjectPtr& c : store_.List(classes->storage_resource(), ""))
      if (c->value("globalDefault", false)) {
        value = value_of(*c);
        from = MetaString(*c, "name");
        spec["priorityClassName"] = from;
        break;
      }
  }
  if (spec.contains("priority") && !spec["priority"].is_null() && spec["priority"] != value)
    return ApiError{403, "Forbidden",
                    r.plural + " \"" + name + "\" is forbidden: the integer value of priority (" +
                        spec["priority"].dump() +
                        ") must not be provided in pod spec; priority admission controller "
                        "computed " +
                        std::to_string(value) + " from the given PriorityClass name",
                    Details(r, name)};
  spec["priority"] = value;
  return std::nullopt;
}

ApiResult ObjectWriter::Create(const ResourceInfo& r, const std::string& ns, json body,
                               const WriteOptions& options) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return CreateLocked(r, ns, std::move(body), options);
}

ApiResult ObjectWriter::CreateLocked(const ResourceInfo& r, const std::string& ns, json body,
                                     const WriteOptions& options) {
  if (!body.is_object()) return ApiResult::Error(BadRequest("the body must be a JSON object"));
  // (Found by fuzz/apiserver_fuzz.cc: a YAML body whose second `kind:` held a mapping answered
  // 500, from value() throwing on the type.)
  for (const char* field : {"apiVersion", "kind"})
    if (body.contains(field) && !body[field].is_string() && !body[field].is_null())
      return ApiResult::Error(
          BadRequest(std::string(field) + ": expected a string, got " + body[field].type_name()));
  std::string api_version = StringField(body, "apiVersion");
  if (api_version.empty()) api_version = r.api_version();
  std::string kind = StringField(body, "kind");
  if (kind.empty()) kind = r.kind;
  if (api_version != r.api_version())
    return ApiResult::Error(BadRequest("the API version in the data (" + api_version +
                                       ") does not match the expected API version (" +
                                       r.api_version() + ")"));
  if (kind != r.kind)
    return ApiResult::Error(BadRequest("the kind in the data (" + kind +
                                       ") does not match the expected kind (" + r.kind + ")"));
  body["apiVersion"] = api_version;
  body["kind"] = kind;
  json& meta = Meta(body);
  std::string body_ns = MetaString(body, "namespace");
  if (r.namespaced) {
    if (!body_ns.empty() && body_ns != ns)
      return ApiResult::Error(BadRequest(
          "the namespace of the provided object does not match the namespace sent on the request"));
    meta["namespace"] = ns;
    if (!store_.Get({"/namespaces", "", ns})) {
      ResourceInfo namespaces = *registry_.Find("", "v1", "namespaces");
      return ApiResult::Error(NotFoundError(namespaces, ns));
    }
  } else {
    meta.erase("namespace");
  }
  std::string name = MetaString(body, "name");
  if (name.empty()) {
    std::string prefix = MetaString(body, "generateName");
    if (prefix.empty())
      return ApiResult::Error(InvalidError(r, "",
                                           {{"FieldValueRequired", "metadata.name",
                                             "Required value: name or generateName is required"}}));
    name = prefix + RandomSuffix();
    meta["name"] = name;
  }
  ApiResult result;
  if (auto error = Admit(r, name, body, options, result.warnings)) return ApiResult::Error(*error);
  if (r.kind == "Pod")
    if (auto error = AdmitPriority(r, name, body)) return ApiResult::Error(*error);
  json& m = body["metadata"];
  m["uid"] = NewUid();
  m["creationTimestamp"] = NowRfc3339();
  m["generation"] = 1;
  m.erase("deletionTimestamp");
  m.erase("deletionGracePeriodSeconds");
  m.erase("resourceVersion");
  m.erase("managedFields");
  if (r.status_subresource) body.erase("status");
  if (r.kind == "Namespace") body["status"] = {{"phase", "Active"}};
  if (r.kind == "CustomResourceDefinition") {
    body["status"] = {{"acceptedNames", body["spec"]["names"]},
                      {"storedVersions", json::array()},
                      {"conditions",
                       {{{"type", "NamesAccepted"},
                         {"status", "True"},
                         {"reason", "NoConflicts"},
                         {"message", "no conflicts found"},
                         {"lastTransitionTime", NowRfc3339()}},
                        {{"type", "Established"},
                         {"status", "True"},
                         {"reason", "InitialNamesAccepted"},
                         {"message", "the initial names have been accepted"},
                         {"lastTransitionTime", NowRfc3339()}}}}};
    for (const auto& v : body["spec"]["versions"])
      if (v.value("storage", false)) body["status"]["storedVersions"].push_back(v["name"]);
  }
  if (options.dry_run) {
    result.object = body;
    result.code = 201;
    return result;
  }
  auto stored = store_.Create(Key(r, ns, name), body);
  if (!stored.ok()) {
    if (stored.status().code() == StatusCode::kAlreadyExists)
      return ApiResult::Error({409, "AlreadyExists",
                               r.qualified() + " \"" + name + "\" already exists",
                               Details(r, name)});
    return ApiResult::Error({500, "InternalError", stored.status().message(), {}});
  }
  if (r.kind == "CustomResourceDefinition")
    registry_.AddCrd(name, *Registry::ResourcesOfCrd(**stored));
  result.object = **stored;
  result.code = 201;
  return result;
}

ApiResult ObjectWriter::Update(const ResourceInfo& r, const std::string& ns,
                               const std::string& name, json body, const std::string& subresource,
                               const WriteOptions& options) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (subresource == "scale") {
    // PUT of an autoscaling/v1 Scale: only spec.replicas moves, with the Scale's version as
    // the precondition (kubectl scale --current-replicas).
    auto live = store_.Get(Key(r, ns, name));
    if (!live) return ApiResult::Error(NotFoundError(r, name));
    if (!body.is_object() || !body.contains("spec") || !body["spec"].contains("replicas") ||
        !body["spec"]["replicas"].is_number_integer())
      return ApiResult::Error(InvalidError(
          r, name, {{"FieldValueRequired", "spec.replicas", "Required value: an integer"}}));
    json updated = *live;
    updated[Pointer(r.scale->spec_replicas_path)] = body["spec"]["replicas"];
    Meta(updated)["resourceVersion"] = MetaString(body, "resourceVersion");
    ApiResult result = UpdateLocked(r, ns, name, updated, "", options);
    if (!result.ok()) return result;
    return GetScale(r, ns, name);
  }
  return UpdateLocked(r, ns, name, std::move(body), subresource, options);
}

ApiResult ObjectWriter::UpdateLocked(const ResourceInfo& r, const std::string& ns,
                                     const std::string& name, json body,
                                     const std::string& subresource, const WriteOptions& options) {
  auto live_ptr = store_.Get(Key(r, ns, name));
  if (!live_ptr) return ApiResult::Error(NotFoundError(r, name));
  const json& live = *live_ptr;
  if (!body.is_object()) return ApiResult::Error(BadRequest("the body must be a JSON object"));
  std::string body_name = MetaString(body, "name");
  if (!body_name.empty() && body_name != name)
    return ApiResult::Error(BadRequest("the name of the object (" + body_name +
                                       ") does not match the name on the URL (" + name + ")"));
  if (body.contains("kind") && body["kind"] != r.kind)
    return ApiResult::Error(BadRequest("the kind in the data (" + body["kind"].dump() +
                                       ") does not match the expected kind (" + r.kind + ")"));
  std::string want_version = MetaString(body, "resourceVersion");
  if (!want_version.empty()) {
    auto v = ParseVersion(want_version);
    if (!v)
      return ApiResult::Error(
          InvalidError(r, name,
                       {{"FieldValueInvalid", "metadata.resourceVersion",
                         "Invalid value: \"" + want_version + "\": must be an integer"}}));
    if (want_version != MetaString(live, "resourceVersion"))
      return ApiResult::Error(ConflictError(r, name));
  }

  json next;
  if (subresource == "status") {
    next = live;
    if (body.contains("status")) {
      next["status"] = body["status"];
    } else {
      next.erase("status");
    }
  } else {
    next = std::move(body);
    next["apiVersion"] = live["apiVersion"];
    next["kind"] = live["kind"];
    if (r.status_subresource) {
      if (live.contains("status")) {
        next["status"] = live["status"];
      } else {
        next.erase("status");
      }
    }
  }
  json& meta = Meta(next);
  const json& live_meta = live["metadata"];
  for (const char* field : {"uid", "creationTimestamp", "deletionTimestamp",
                            "deletionGracePeriodSeconds", "namespace", "name", "generation"}) {
    if (live_meta.contains(field)) {
      meta[field] = live_meta[field];
    } else {
      meta.erase(field);
    }
  }
  meta.erase("managedFields");
  ApiResult result;
  if (auto error = Admit(r, name, next, options, result.warnings)) return ApiResult::Error(*error);
  if (subresource.empty() && GenerationRelevant(next, r.status_subresource) !=
                                 GenerationRelevant(live, r.status_subresource))
    meta["generation"] = live_meta.value("generation", 1) + 1;
  meta["resourceVersion"] = live_meta["resourceVersion"];

  if (next == live) {  // as the apiserver: a no-op update writes nothing and keeps the version
    result.object = live;
    return result;
  }
  if (options.dry_run) {
    result.object = next;
    return result;
  }
  bool finalized = meta.contains("deletionTimestamp") && Finalizers(next).empty();
  auto stored =
      store_.Update(Key(r, ns, name), next, ParseVersion(MetaString(live, "resourceVersion")));
  if (!stored.ok()) return ApiResult::Error({500, "InternalError", stored.status().message(), {}});
  if (r.kind == "CustomResourceDefinition") {
    auto resources = Registry::ResourcesOfCrd(**stored);
    if (resources.ok()) registry_.AddCrd(name, std::move(*resources));
  }
  result.object = **stored;
  if (finalized) {
    // The last finalizer is gone from an object being deleted: now it really goes.
    ApiResult removed = Remove(r, ns, name, "Background");
    if (removed.ok()) result.object = removed.object;
  }
  return result;
}

ApiResult ObjectWriter::Patch(const ResourceInfo& r, const std::string& ns, const std::string& name,
                              const std::string& content_type, const std::string& patch_text,
                              const std::string& subresource, const WriteOptions& options) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  std::string type = content_type.substr(0, content_type.find(';'));
  json patch;
  if (type == "application/apply-patch+yaml") {
    auto parsed = ParseYaml(patch_text);
    if (!parsed.ok())
      return ApiResult::Error(BadRequest("error decoding YAML: " + parsed.status().message()));
    patch = std::move(*parsed);
  } else {
    patch = json::parse(patch_text, nullptr, false);
    if (patch.is_discarded())
      return ApiResult::Error(BadRequest("error decoding patch: invalid JSON"));
  }
  auto live = store_.Get(Key(r, ns, name));
  if (type == "application/apply-patch+yaml") {
    // Server-side apply, simplified: the applied configuration is merged into the live object
    // (no field ownership); a missing object is created, as the apiserver does.
    if (!patch.is_object()) return ApiResult::Error(BadRequest("apply patch: expected an object"));
    if (!live) {
      ApiResult created = CreateLocked(r, ns, patch, options);
      return created;
    }
    json merged = *live;
    merged.merge_patch(patch);
    return UpdateLocked(r, ns, name, merged, subresource, options);
  }
  if (!live) return ApiResult::Error(NotFoundError(r, name));
  json base = subresource == "scale" ? GetScale(r, ns, name).object : *live;
  json patched = base;
  if (type == "application/merge-patch+json" ||
      (type == "application/strategic-merge-patch+json" && !r.custom)) {
    // Strategic merge on built-in kinds is served as a JSON merge patch: lists are replaced,
    // not merged by key (docs/local-cluster.md).
    if (!patch.is_object()) return ApiResult::Error(BadRequest("merge patch: expected an object"));
    patched.merge_patch(patch);
  } else if (type == "application/json-patch+json") {
    if (!patch.is_array())
      return ApiResult::Error(BadRequest("json patch: expected an array of operations"));
    try {
      patched = base.patch(patch);
    } catch (const std::exception& e) {
      return ApiResult::Error(
          {422,
           "Invalid",
           std::string("the server rejected our request due to an error in our request: ") +
               e.what(),
           {}});
    }
  } else {
    return ApiResult::Error(
        {415,
         "UnsupportedMediaType",
         "the body of the request was in an unknown format - accepted media types include: "
         "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
         {}});
  }
  if (subresource == "scale") return Update(r, ns, name, patched, "scale", options);
  if (MetaString(patch, "resourceVersion").empty())
    Meta(patched)["resourceVersion"] = MetaString(*live, "resourceVersion");
  return UpdateLocked(r, ns, name, patched, subresource, options);
}

ApiResult ObjectWriter::GetScale(const ResourceInfo& r, const std::string& ns,
                                 const std::string& name) {
  auto live = store_.Get(Key(r, ns, name));
  if (!live) return ApiResult::Error(NotFoundError(r, name));
  if (!r.scale) return ApiResult::Error(NotFoundError(r, name + "/scale"));
  const json& o = *live;
  json scale = {{"kind", "Scale"},
                {"apiVersion", "autoscaling/v1"},
                {"metadata",
                 {{"name", name},
                  {"uid", o["metadata"].value("uid", "")},
                  {"resourceVersion", o["metadata"].value("resourceVersion", "")},
                  {"creationTimestamp", o["metadata"].value("creationTimestamp", "")}}},
                {"spec", json::object()},
                {"status", {{"replicas", 0}}}};
  if (r.namespaced) scale["metadata"]["namespace"] = ns;
  auto spec_ptr = Pointer(r.scale->spec_replicas_path);
  if (o.contains(spec_ptr)) scale["spec"]["replicas"] = o[spec_ptr];
  auto status_ptr = Pointer(r.scale->status_replicas_path);
  if (o.contains(status_ptr)) scale["status"]["replicas"] = o[status_ptr];
  if (!r.scale->label_selector_path.empty()) {
    auto sel = Pointer(r.scale->label_selector_path);
    if (o.contains(sel)) scale["status"]["selector"] = o[sel];
  }
  ApiResult result;
  result.object = scale;
  return result;
}

ApiResult ObjectWriter::Delete(const ResourceInfo& r, const std::string& ns,
                               const std::string& name, const json& delete_options) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  std::string propagation = "Background";
  json preconditions = json::object();
  if (delete_options.is_object()) {
    if (delete_options.contains("propagationPolicy") &&
        delete_options["propagationPolicy"].is_string())
      propagation = delete_options["propagationPolicy"];
    if (delete_options.contains("orphanDependents") && delete_options["orphanDependents"] == true)
      propagation = "Orphan";
    if (delete_options.contains("preconditions") && delete_options["preconditions"].is_object())
      preconditions = delete_options["preconditions"];
  }
  if (propagation != "Background" && propagation != "Foreground" && propagation != "Orphan")
    return ApiResult::Error(
        InvalidError(r, name,
                     {{"FieldValueNotSupported", "propagationPolicy",
                       "Unsupported value: \"" + propagation +
                           "\": supported values: \"Foreground\", \"Background\", \"Orphan\""}}));
  std::optional<int64_t> grace;
  if (delete_options.is_object() && delete_options.contains("gracePeriodSeconds")) {
    const json& g = delete_options["gracePeriodSeconds"];
    if (!g.is_number_integer() || g.get<int64_t>() < 0)
      return ApiResult::Error(InvalidError(
          r, name, {{"FieldValueInvalid", "gracePeriodSeconds", "Invalid value: must be >= 0"}}));
    grace = g.get<int64_t>();
  }
  if (r.kind == "Pod") {
    ApiResult graceful = DeletePodGracefully(r, ns, name, grace, preconditions);
    if (graceful.error || !graceful.object.is_null()) return graceful;
  }
  return DeleteLocked(r, ns, name, propagation, preconditions);
}

// The pod strategy's graceful deletion (pkg/registry/core/pod/strategy.go CheckGracefulDelete):
// a pod that runs on a node is only marked — deletionTimestamp = now + grace and
// deletionGracePeriodSeconds — and the kubelet, after stopping its containers, deletes it
// with grace 0. Unbound or finished pods, and grace 0, go at once (a null object here).
ApiResult ObjectWriter::DeletePodGracefully(const ResourceInfo& r, const std::string& ns,
                                            const std::string& name, std::optional<int64_t> grace,
                                            const json& preconditions) {
  auto live_ptr = store_.Get(Key(r, ns, name));
  if (!live_ptr) return ApiResult::Error(NotFoundError(r, name));
  const json& live = *live_ptr;
  const json& spec = live.contains("spec") ? live["spec"] : json::object();
  std::string phase = live.contains("status") ? live["status"].value("phase", "") : "";
  bool bound = spec.contains("nodeName") && spec["nodeName"].is_string() &&
               !spec["nodeName"].get<std::string>().empty();
  if (!grace) {
    grace = 30;
    if (spec.contains("terminationGracePeriodSeconds") &&
        spec["terminationGracePeriodSeconds"].is_number_integer())
      grace = spec["terminationGracePeriodSeconds"].get<int64_t>();
  }
  if (!bound || phase == "Succeeded" || phase == "Failed" || *grace <= 0) return ApiResult{};
  if (preconditions.contains("uid") && preconditions["uid"] != live["metadata"].value("uid", ""))
    return ApiResult{};  // DeleteLocked answers the precondition failure
  if (preconditions.contains("resourceVersion") &&
      preconditions["resourceVersion"] != live["metadata"].value("resourceVersion", ""))
    return ApiResult{};
  json marked = live;
  json& meta = marked["metadata"];
  if (meta.contains("deletionGracePeriodSeconds") &&
      meta["deletionGracePeriodSeconds"].is_number_integer() &&
      meta["deletionGracePeriodSeconds"].get<int64_t>() <= *grace) {
    ApiResult unchanged;  // already terminating with a grace at least as short
    unchanged.object = live;
    return unchanged;
  }
  meta["deletionTimestamp"] = NowRfc3339(std::chrono::seconds(*grace));
  meta["deletionGracePeriodSeconds"] = *grace;
  auto stored =
      store_.Update(Key(r, ns, name), marked, ParseVersion(MetaString(live, "resourceVersion")));
  if (!stored.ok()) return ApiResult::Error({500, "InternalError", stored.status().message(), {}});
  ApiResult result;
  result.object = **stored;
  return result;
}

ApiResult ObjectWriter::DeleteLocked(const ResourceInfo& r, const std::string& ns,
                                     const std::string& name, const std::string& propagation,
                                     const json& preconditions) {
  auto live_ptr = store_.Get(Key(r, ns, name));
  if (!live_ptr) return ApiResult::Error(NotFoundError(r, name));
  json live = *live_ptr;
  if (preconditions.contains("uid") && preconditions["uid"].is_string() &&
      preconditions["uid"] != live["metadata"].value("uid", ""))
    return ApiResult::Error(
        {409, "Conflict",
         "Precondition failed: UID in precondition: " + preconditions["uid"].get<std::string>() +
             ", UID in object meta: " + live["metadata"].value("uid", ""),
         Details(r, name)});
  if (preconditions.contains("resourceVersion") && preconditions["resourceVersion"].is_string() &&
      preconditions["resourceVersion"] != live["metadata"].value("resourceVersion", ""))
    return ApiResult::Error(
        {409, "Conflict",
         "Precondition failed: ResourceVersion in precondition: " +
             preconditions["resourceVersion"].get<std::string>() +
             ", ResourceVersion in object meta: " + live["metadata"].value("resourceVersion", ""),
         Details(r, name)});
  std::vector<std::string> finalizers = Finalizers(live);
  bool already_deleting = live["metadata"].contains("deletionTimestamp");
  if (propagation == "Foreground" &&
      std::find(finalizers.begin(), finalizers.end(), "foregroundDeletion") == finalizers.end())
    finalizers.push_back("foregroundDeletion");
  if (propagation == "Orphan" &&
      std::find(finalizers.begin(), finalizers.end(), "orphan") == finalizers.end())
    finalizers.push_back("orphan");
  if (finalizers.empty()) return Remove(r, ns, name, propagation);

  // Finalizers hold the object: mark it (deletionTimestamp) and let their owners finish.
  json& meta = live["metadata"];
  if (!already_deleting) {
    meta["deletionTimestamp"] = NowRfc3339();
    meta["deletionGracePeriodSeconds"] = 0;
  }
  meta["finalizers"] = finalizers;
  auto stored =
      store_.Update(Key(r, ns, name), live, ParseVersion(MetaString(*live_ptr, "resourceVersion")));
  if (!stored.ok()) return ApiResult::Error({500, "InternalError", stored.status().message(), {}});
  std::string uid = meta.value("uid", "");
  ApiResult result;
  result.object = **stored;
  if (propagation == "Orphan") {
    // As the garbage collector's orphan finalizer: dependents lose the owner reference.
    std::set<std::string> seen;
    for (const auto& info : registry_.All()) {
      if (!seen.insert(info.storage_resource()).second) continue;
      for (const auto& dep : store_.List(info.storage_resource(), "")) {
        if (!OwnedBy(*dep, uid)) continue;
        json updated = *dep;
        auto& refs = updated["metadata"]["ownerReferences"];
        refs.erase(std::remove_if(refs.begin(), refs.end(),
                                  [&](const json& ref) { return ref.value("uid", "") == uid; }),
                   refs.end());
        if (refs.empty()) updated["metadata"].erase("ownerReferences");
        store_
            .Update(
                {info.storage_resource(), MetaString(*dep, "namespace"), MetaString(*dep, "name")},
                updated, std::nullopt)
            .status()
            .ok();
      }
    }
    json next = result.object;
    std::erase(finalizers, "orphan");
    next["metadata"]["finalizers"] = finalizers;
    return UpdateLocked(r, ns, name, next, "", WriteOptions{"Ignore", false});
  }
  if (propagation == "Foreground") {
    CollectDependents(uid, "Background");
    FinishForegroundDeletions();
    auto after = store_.Get(Key(r, ns, name));
    if (after) result.object = *after;
  }
  return result;
}

ApiResult ObjectWriter::Remove(const ResourceInfo& r, const std::string& ns,
                               const std::string& name, const std::string& propagation) {
  auto deleted = store_.Delete(Key(r, ns, name), std::nullopt);
  if (!deleted.ok()) {
    if (deleted.status().code() == StatusCode::kNotFound)
      return ApiResult::Error(NotFoundError(r, name));
    return ApiResult::Error({500, "InternalError", deleted.status().message(), {}});
  }
  const json& object = **deleted;
  std::string uid = object["metadata"].value("uid", "");
  if (r.kind == "CustomResourceDefinition") {
    // The CRD's objects go with it, then the kinds stop being served.
    std::string resource =
        object["spec"].value("group", "") + "/" + object["spec"]["names"].value("plural", "");
    for (const auto& cr : store_.List(resource, ""))
      store_.Delete({resource, MetaString(*cr, "namespace"), MetaString(*cr, "name")}, std::nullopt)
          .status()
          .ok();
    registry_.RemoveCrd(name);
  }
  if (r.kind == "Namespace") {
    // The namespace controller's job, done at once: everything in the namespace is deleted.
    std::set<std::string> seen;
    for (const auto& info : registry_.All()) {
      if (!info.namespaced || !seen.insert(info.storage_resource()).second) continue;
      for (const auto& child : store_.List(info.storage_resource(), name))
        DeleteLocked(info, name, MetaString(*child, "name"), "Background", json::object());
    }
  }
  if (propagation != "Orphan") CollectDependents(uid, propagation);
  FinishForegroundDeletions();
  ApiResult result;
  result.object = object;
  return result;
}

void ObjectWriter::CollectDependents(const std::string& owner_uid, const std::string& propagation) {
  if (owner_uid.empty()) return;
  // Every live uid, to tell whether a dependent still has another owner.
  std::set<std::string> live_uids;
  std::vector<std::pair<ResourceInfo, ObjectPtr>> dependents;
  std::set<std::string> seen;
  for (const auto& info : registry_.All()) {
    if (!seen.insert(info.storage_resource()).second) continue;
    for (const auto& obj : store_.List(info.storage_resource(), "")) {
      const json& meta = (*obj)["metadata"];
      auto finalizers = Finalizers(*obj);
      bool dying_in_foreground =
          meta.contains("deletionTimestamp") &&
          std::find(finalizers.begin(), finalizers.end(), "foregroundDeletion") != finalizers.end();
      if (!dying_in_foreground) live_uids.insert(meta.value("uid", ""));
      if (OwnedBy(*obj, owner_uid)) dependents.emplace_back(info, obj);
    }
  }
  live_uids.erase(owner_uid);
  for (const auto& [info, dep] : dependents) {
    bool other_owner = false;
    for (const auto& ref : (*dep)["metadata"]["ownerReferences"])
      other_owner = other_owner || (ref.value("uid", "") != owner_uid &&
                                    live_uids.count(ref.value("uid", "")) > 0);
    std::string dep_ns = MetaString(*dep, "namespace");
    std::string dep_name = MetaString(*dep, "name");
    if (other_owner) {
      // As the garbage collector: the dangling reference goes, the dependent stays.
      json updated = *dep;
      auto& refs = updated["metadata"]["ownerReferences"];
      refs.erase(std::remove_if(refs.begin(), refs.end(),
                                [&](const json& ref) { return ref.value("uid", "") == owner_uid; }),
                 refs.end());
      store_.Update({info.storage_resource(), dep_ns, dep_name}, updated, std::nullopt)
          .status()
          .ok();
      continue;
    }
    if (!store_.Get({info.storage_resource(), dep_ns, dep_name})) continue;
    if (info.kind == "Pod") {
      ApiResult graceful =
          DeletePodGracefully(info, dep_ns, dep_name, std::nullopt, json::object());
      if (graceful.error || !graceful.object.is_null()) continue;
    }
    DeleteLocked(info, dep_ns, dep_name, propagation == "Foreground" ? "Foreground" : "Background",
                 json::object());
  }
}

void ObjectWriter::FinishForegroundDeletions() {
  std::set<std::string> seen;
  for (const auto& info : registry_.All()) {
    if (!seen.insert(info.storage_resource()).second) continue;
    for (const auto& obj : store_.List(info.storage_resource(), "")) {
      auto finalizers = Finalizers(*obj);
      if (!(*obj)["metadata"].contains("deletionTimestamp") ||
          std::find(finalizers.begin(), finalizers.end(), "foregroundDeletion") == finalizers.end())
        continue;
      std::string uid = (*obj)["metadata"].value("uid", "");
      bool has_dependents = false;
      std::set<std::string> seen_inner;
      for (const auto& other : registry_.All()) {
        if (!seen_inner.insert(other.storage_resource()).second) continue;
        for (const auto& dep : store_.List(other.storage_resource(), ""))
          has_dependents = has_dependents || OwnedBy(*dep, uid);
      }
      if (has_dependents) continue;
      json next = *obj;
      std::erase(finalizers, "foregroundDeletion");
      next["metadata"]["finalizers"] = finalizers;
      UpdateLocked(info, MetaString(*obj, "namespace"), MetaString(*obj, "name"), next, "",
                   WriteOptions{"Ignore", false});
    }
  }
}

}  // namespace tidal::local
