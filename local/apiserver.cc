// local/apiserver.cc — routing, authentication, discovery, reads and watches; writes
// go to ObjectWriter.
#include "local/apiserver.h"

#include <openssl/crypto.h>

#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "common/log.h"
#include "common/yaml_json.h"
#include "local/api_error.h"
#include "local/protobuf.h"
#include "local/selectors.h"
#include "local/table.h"

namespace tidal::local {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

http::Response JsonResponse(int code, const json& body) {
  http::Response r;
  r.status = code;
  r.headers.Set("Content-Type", "application/json");
  r.headers.Set("Cache-Control", "no-cache, private");
  // Bytes from the request (a path segment, a field) may be invalid UTF-8 and end up in an
  // error's message: they are replaced with U+FFFD, as Go's encoder does for kube-apiserver.
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

http::Response ErrorResponse(const ApiError& e) { return JsonResponse(e.code, StatusJson(e)); }

bool TokenMatches(const std::string& header, const std::string& token) {
  const std::string prefix = "Bearer ";
  if (header.size() != prefix.size() + token.size() ||
      header.compare(0, prefix.size(), prefix) != 0)
    return false;
  return CRYPTO_memcmp(header.data() + prefix.size(), token.data(), token.size()) == 0;
}

}  // namespace

// One request: which route it is, and the answer.
class RequestContext {
 public:
  RequestContext(ApiServer& server, const http::Request& request, http::ResponseWriter& writer)
      : s_(server), req_(request), w_(writer) {}

  void Run() {
    const std::string& path = req_.path;
    if (path == "/healthz" || path == "/readyz" || path == "/livez") {
      http::Response r;
      r.headers.Set("Content-Type", "text/plain");
      r.body = "ok";
      Reply(r);
      return;
    }
    if (!TokenMatches(req_.headers.Get("authorization").value_or(""), s_.options_.token)) {
      // As kube-apiserver without valid credentials: 401 Unauthorized.
      Reply(ErrorResponse({401, "Unauthorized", "Unauthorized", {}}));
      return;
    }
    std::vector<std::string> seg = PathSegments(path);
    if (path == "/version") return Reply(JsonResponse(200, VersionInfo()));
    if (seg.empty())
      return Reply(JsonResponse(200, {{"paths", {"/api", "/apis", "/version", "/openapi/v3"}}}));
    if (seg[0] == "openapi") return OpenApi(seg);
    if (seg[0] == "api") {
      if (seg.size() == 1) return Reply(JsonResponse(200, s_.registry_.CoreVersions()));
      return GroupVersionPath("", seg[1], std::vector<std::string>(seg.begin() + 2, seg.end()));
    }
    if (seg[0] == "apis") {
      if (seg.size() == 1) return Reply(JsonResponse(200, s_.registry_.GroupList()));
      if (seg.size() == 2) {
        auto group = s_.registry_.Group(seg[1]);
        if (!group) return NotFoundPath();
        return Reply(JsonResponse(200, *group));
      }
      return GroupVersionPath(seg[1], seg[2], std::vector<std::string>(seg.begin() + 3, seg.end()));
    }
    NotFoundPath();
  }

 private:
  void Reply(http::Response r) {
    for (const auto& w : warnings_) r.headers.Add("Warning", "299 - \"" + w + "\"");
    w_.Send(std::move(r)).ok();
  }
  void NotFoundPath() {
    Reply(ErrorResponse({404, "NotFound", "the server could not find the requested resource", {}}));
  }
  void MethodNotAllowed() {
    Reply(ErrorResponse({405,
                         "MethodNotAllowed",
                         "the server does not allow this method on the requested resource",
                         {}}));
  }

  json VersionInfo() const {
    return {{"major", "1"},       {"minor", "32"},           {"gitVersion", "v1.32.0-tidal-local"},
            {"gitCommit", ""},    {"gitTreeState", "clean"}, {"buildDate", ""},
            {"goVersion", "n/a"}, {"compiler", "c++"},       {"platform", "linux/amd64"}};
  }

  void OpenApi(const std::vector<std::string>& seg) {
    if (seg.size() >= 2 && seg[1] == "v3") {
      if (seg.size() == 2) return Reply(JsonResponse(200, s_.registry_.OpenApiRoot()));
      std::optional<json> doc;
      if (seg.size() == 4 && seg[2] == "api") doc = s_.registry_.OpenApiGroupVersion("", seg[3]);
      if (seg.size() == 5 && seg[2] == "apis")
        doc = s_.registry_.OpenApiGroupVersion(seg[3], seg[4]);
      if (doc) return Reply(JsonResponse(200, *doc));
    }
    NotFoundPath();  // /openapi/v2 included: kubectl ignores its 404 when v3 is served
  }

  void GroupVersionPath(const std::string& group, const std::string& version,
                        const std::vector<std::string>& rest) {
    if (rest.empty()) {
      auto list = s_.registry_.ResourceList(group, version);
      if (!list) return NotFoundPath();
      return Reply(JsonResponse(200, *list));
    }
    // namespaces/{ns}/{plural}[/{name}[/{sub}]] or {plural}[/{name}[/{sub}]]; but
    // namespaces/{name}[/status] is the Namespace object itself.
    std::string ns, plural, name, sub;
    if (rest[0] == "namespaces" && rest.size() >= 3 && rest[2] != "status" &&
        rest[2] != "finalize") {
      ns = rest[1];
      plural = rest[2];
      if (rest.size() > 3) name = rest[3];
      if (rest.size() > 4) sub = rest[4];
      if (rest.size() > 5) return NotFoundPath();
    } else {
      plural = rest[0];
      if (rest.size() > 1) name = rest[1];
      if (rest.size() > 2) sub = rest[2];
      if (rest.size() > 3) return NotFoundPath();
    }
    auto r = s_.registry_.Find(group, version, plural);
    if (!r) return NotFoundPath();
    if (!ns.empty() && !r->namespaced) return NotFoundPath();
    if (!sub.empty() &&
        !((sub == "status" && r->status_subresource) || (sub == "scale" && r->scale) ||
          (sub == "log" && r->log_subresource) || (sub == "eviction" && r->eviction_subresource)))
      return NotFoundPath();
    if (r->kind == "SelfSubjectAccessReview") return AccessReview();
    if (r->namespaced && ns.empty() && !name.empty()) return NotFoundPath();
    Resource(*r, ns, name, sub);
  }

  // A single user holds every right in `tidal local`: any access review is allowed. The body
  // (kubectl sends protobuf) is not decoded.
  void AccessReview() {
    if (req_.method != "POST") return MethodNotAllowed();
    Reply(JsonResponse(201,
                       {{"kind", "SelfSubjectAccessReview"},
                        {"apiVersion", "authorization.k8s.io/v1"},
                        {"metadata", json::object()},
                        {"spec", json::object()},
                        {"status", {{"allowed", true}, {"reason", "tidal local: single user"}}}}));
  }

  WriteOptions Options() const {
    WriteOptions o;
    o.field_validation = req_.QueryValue("fieldValidation").value_or("Strict");
    if (o.field_validation.empty()) o.field_validation = "Strict";
    o.dry_run = req_.QueryValue("dryRun").value_or("") == "All";
    return o;
  }

  std::optional<json> ParseBody() {
    std::string ct = req_.headers.Get("content-type").value_or("application/json");
    if (ct.find("protobuf") != std::string::npos) {
      auto decoded = DecodeKubeProtobuf(req_.body);
      if (decoded.ok()) return std::move(*decoded);
      if (decoded.status().code() == StatusCode::kInvalidArgument) {
        Reply(ErrorResponse(BadRequest("error decoding protobuf: " + decoded.status().message())));
        return std::nullopt;
      }
      Reply(ErrorResponse({415,
                           "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media "
                           "types include: application/json, application/yaml",
                           {}}));
      return std::nullopt;
    }
    json body;
    if (ct.find("yaml") != std::string::npos) {
      auto parsed = ParseYaml(req_.body);
      if (!parsed.ok()) {
        Reply(ErrorResponse(BadRequest("error decoding YAML: " + parsed.status().message())));
        return std::nullopt;
      }
      body = std::move(*parsed);
    } else {
      body = json::parse(req_.body, nullptr, false);
      if (body.is_discarded()) {
        Reply(ErrorResponse(
            BadRequest("the body of the request could not be decoded: invalid JSON")));
        return std::nullopt;
      }
    }
    return body;
  }

  void ReplyResult(const ApiResult& result) {
    warnings_.insert(warnings_.end(), result.warnings.begin(), result.warnings.end());
    if (!result.ok()) return Reply(ErrorResponse(*result.error));
    Reply(JsonResponse(result.code, result.object));
  }

  void Resource(const ResourceInfo& r, const std::string& ns, const std::string& name,
                const std::string& sub) {
    ObjectWriter& writer = *s_.writer_;
    const std::string& m = req_.method;
    if (sub == "log") return Logs(r, ns, name);
    if (sub == "eviction") return Evict(r, ns, name);
    if (name.empty()) {
      if (m == "GET") {
        if (req_.QueryValue("watch").value_or("") == "true" || req_.QueryValue("watch") == "1")
          return Watch(r, ns);
        return List(r, ns);
      }
      if (m == "POST") {
        auto body = ParseBody();
        if (!body) return;
        if (s_.options_.admit_create)
          if (std::string refused = s_.options_.admit_create(r.plural, ns, *body); !refused.empty())
            return ReplyResult(ApiResult::Error(
                {422, "Invalid", "admission webhook denied the request: " + refused}));
        return ReplyResult(writer.Create(r, ns, std::move(*body), Options()));
      }
      if (m == "DELETE") return DeleteCollection(r, ns);
      return MethodNotAllowed();
    }
    if (m == "GET") {
      if (sub == "scale") return ReplyResult(writer.GetScale(r, ns, name));
      return Get(r, ns, name);
    }
    if ((m == "PUT" || m == "PATCH") && s_.options_.admit_update)
      if (std::string refused = s_.options_.admit_update(r.plural, ns, name, sub, req_.body);
          !refused.empty())
        return ReplyResult(
            ApiResult::Error({422, "Invalid", "admission webhook denied the request: " + refused}));
    if (m == "PUT") {
      auto body = ParseBody();
      if (!body) return;
      return ReplyResult(writer.Update(r, ns, name, std::move(*body), sub, Options()));
    }
    if (m == "PATCH") {
      return ReplyResult(writer.Patch(r, ns, name, req_.headers.Get("content-type").value_or(""),
                                      req_.body, sub, Options()));
    }
    if (m == "DELETE") {
      json options = json::object();
      if (!req_.body.empty()) {
        auto body = ParseBody();
        if (!body) return;
        options = *body;
      }
      if (auto p = req_.QueryValue("propagationPolicy")) options["propagationPolicy"] = *p;
      if (auto g = req_.QueryValue("gracePeriodSeconds"); g && !g->empty()) {
        char* end = nullptr;
        long long v = std::strtoll(g->c_str(), &end, 10);
        if (*end)
          return Reply(ErrorResponse(BadRequest("gracePeriodSeconds: expected an integer")));
        options["gracePeriodSeconds"] = v;
      }
      return ReplyResult(writer.Delete(r, ns, name, options));
    }
    MethodNotAllowed();
  }

  // POST pods/{name}/eviction, a policy/v1 Eviction: what `kubectl drain` sends. Its
  // deleteOptions go to a graceful delete of the pod (grace period, preconditions), as the
  // apiserver's eviction handler does for a pod no PodDisruptionBudget covers: tidal local keeps
  // none, so no eviction is refused with 429.
  void Evict(const ResourceInfo& r, const std::string& ns, const std::string& name) {
    if (req_.method != "POST") return MethodNotAllowed();
    auto body = ParseBody();
    if (!body) return;
    if (!body->is_object() || body->value("kind", "") != "Eviction")
      return Reply(ErrorResponse(BadRequest("the body must be a policy/v1 Eviction")));
    const json meta = body->value("metadata", json::object());
    if (!meta.is_object() || meta.value("name", "") != name)
      return Reply(ErrorResponse(BadRequest("name in URL does not match name in Eviction object")));
    json options = body->value("deleteOptions", json::object());
    if (!options.is_object())
      return Reply(ErrorResponse(BadRequest("deleteOptions: expected an object")));
    // A dry run (`kubectl drain --dry-run=server`) checks the pod is there and deletes nothing.
    const json dry = options.value("dryRun", json::array());
    const bool dry_run = Options().dry_run || (dry.is_array() && !dry.empty());
    if (dry_run && !s_.store_->Get({r.storage_resource(), ns, name}))
      return Reply(ErrorResponse(NotFoundError(r, name)));
    ApiResult deleted = dry_run ? ApiResult{} : s_.writer_->Delete(r, ns, name, options);
    if (!deleted.ok()) return ReplyResult(deleted);
    Reply(JsonResponse(201, {{"kind", "Status"},
                             {"apiVersion", "v1"},
                             {"metadata", json::object()},
                             {"status", "Success"},
                             {"code", 201}}));
  }

  void Get(const ResourceInfo& r, const std::string& ns, const std::string& name) {
    auto object = s_.store_->Get({r.storage_resource(), r.namespaced ? ns : "", name});
    if (!object) return Reply(ErrorResponse(NotFoundError(r, name)));
    if (WantsTable(req_.headers.Get("accept").value_or("")))
      return Reply(JsonResponse(
          200, ToTable(r, {*object}, true, (*object)["metadata"].value("resourceVersion", ""),
                       std::time(nullptr))));
    Reply(JsonResponse(200, *object));
  }

  struct Filter {
    LabelSelector labels;
    FieldSelector fields;
  };
  std::optional<Filter> ParseFilter() {
    Filter f;
    auto labels = ParseLabelSelector(req_.QueryValue("labelSelector").value_or(""));
    if (!labels.ok()) {
      Reply(ErrorResponse(BadRequest("unable to parse requirement: " + labels.status().message())));
      return std::nullopt;
    }
    auto fields = ParseFieldSelector(req_.QueryValue("fieldSelector").value_or(""));
    if (!fields.ok()) {
      Reply(ErrorResponse(BadRequest(fields.status().message())));
      return std::nullopt;
    }
    f.labels = std::move(*labels);
    f.fields = std::move(*fields);
    return f;
  }
  static bool Selected(const Filter& f, const json& object) {
    const json& meta = object["metadata"];
    return Matches(f.labels, meta.contains("labels") ? meta["labels"] : json::object()) &&
           Matches(f.fields, object);
  }

  void List(const ResourceInfo& r, const std::string& ns) {
    auto filter = ParseFilter();
    if (!filter) return;
    int64_t limit = 0;
    if (auto l = req_.QueryValue("limit"); l && !l->empty()) {
      try {
        limit = std::stoll(*l);
      } catch (...) {
        return Reply(ErrorResponse(BadRequest("limit: expected an integer, got \"" + *l + "\"")));
      }
    }
    std::string after = req_.QueryValue("continue").value_or("");
    // The version first, then the objects: every object listed is at or after it, so a watch
    // from this version misses nothing.
    std::string version = std::to_string(s_.store_->CurrentVersion());
    std::vector<ObjectPtr> items;  // shared with the store: no copies
    std::string next;
    int64_t remaining = 0;
    for (const auto& object : s_.store_->List(r.storage_resource(), r.namespaced ? ns : "")) {
      const json& o = *object;
      std::string key =
          o["metadata"].value("namespace", "") + "/" + o["metadata"].value("name", "");
      if (!after.empty() && key <= after) continue;
      if (!Selected(*filter, o)) continue;
      if (limit > 0 && static_cast<int64_t>(items.size()) >= limit) {
        ++remaining;
        continue;
      }
      items.push_back(object);
      if (limit > 0 && static_cast<int64_t>(items.size()) == limit) next = key;
    }
    if (remaining == 0) next.clear();
    if (WantsTable(req_.headers.Get("accept").value_or(""))) {
      std::vector<json> objects;
      objects.reserve(items.size());
      for (const auto& item : items) objects.push_back(*item);
      json table = ToTable(r, objects, true, version, std::time(nullptr));
      if (!next.empty()) table["metadata"]["continue"] = next;
      return Reply(JsonResponse(200, table));
    }
    json list = {{"kind", r.list_kind},
                 {"apiVersion", r.api_version()},
                 {"metadata", {{"resourceVersion", version}}},
                 {"items", json::array()}};
    if (!next.empty()) {
      list["metadata"]["continue"] = next;
      list["metadata"]["remainingItemCount"] = remaining;
    }
    // The envelope, then each stored object serialised straight into the body.
    http::Response response = JsonResponse(200, list);
    std::string& body = response.body;
    auto tail = body.rfind("[]");
    std::string end = body.substr(tail + 1);
    body.resize(tail + 1);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) body += ',';
      body += items[i]->dump();
    }
    body += end;
    Reply(response);
  }

  void DeleteCollection(const ResourceInfo& r, const std::string& ns) {
    auto filter = ParseFilter();
    if (!filter) return;
    json deleted = json::array();
    for (const auto& object : s_.store_->List(r.storage_resource(), r.namespaced ? ns : "")) {
      if (!Selected(*filter, *object)) continue;
      ApiResult res = s_.writer_->Delete(r, (*object)["metadata"].value("namespace", ""),
                                         (*object)["metadata"].value("name", ""), json::object());
      if (res.ok()) deleted.push_back(res.object);
    }
    Reply(JsonResponse(
        200, {{"kind", r.list_kind},
              {"apiVersion", r.api_version()},
              {"metadata", {{"resourceVersion", std::to_string(s_.store_->CurrentVersion())}}},
              {"items", deleted}}));
  }

  // Watch (as kube-apiserver's watch cache): events after resourceVersion as chunked JSON lines;
  // "" or "0" first sends the current objects as ADDED; a version older than the history gets
  // an ERROR event with a 410 Expired Status; BOOKMARKs only when allowWatchBookmarks=true.
  void Watch(const ResourceInfo& r, const std::string& ns) {
    auto filter = ParseFilter();
    if (!filter) return;
    std::string rv_text = req_.QueryValue("resourceVersion").value_or("");
    int64_t rv = 0;
    if (!rv_text.empty()) {
      try {
        rv = std::stoll(rv_text);
      } catch (...) {
        return Reply(ErrorResponse(
            BadRequest("resourceVersion: expected an integer, got \"" + rv_text + "\"")));
      }
    }
    bool bookmarks = req_.QueryValue("allowWatchBookmarks").value_or("") == "true";
    int64_t timeout_s = 1800;
    if (auto t = req_.QueryValue("timeoutSeconds"); t && !t->empty()) {
      try {
        timeout_s = std::stoll(*t);
      } catch (...) {
        return Reply(ErrorResponse(BadRequest("timeoutSeconds: expected an integer")));
      }
    }
    bool table = WantsTable(req_.headers.Get("accept").value_or(""));
    bool first_table = true;
    http::Headers h;
    h.Set("Content-Type", "application/json");
    h.Set("Cache-Control", "no-cache, private");
    if (!w_.StartStream(200, h).ok()) return;
    auto send = [&](const std::string& type, const json& object) {
      json event = {{"type", type}, {"object", object}};
      if (table && (type == "ADDED" || type == "MODIFIED" || type == "DELETED")) {
        event["object"] =
            ToTable(r, {object}, first_table, object["metadata"].value("resourceVersion", ""),
                    std::time(nullptr));
        first_table = false;
      }
      return w_.WriteChunk(event.dump(-1, ' ', false, json::error_handler_t::replace) + "\n").ok();
    };
    std::string want_ns = r.namespaced ? ns : "";
    if (rv_text.empty() || rv == 0) {
      rv = s_.store_->CurrentVersion();
      for (const auto& o : s_.store_->List(r.storage_resource(), want_ns))
        if (Selected(*filter, *o) && !send("ADDED", *o)) return;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    auto next_bookmark = std::chrono::steady_clock::now() + s_.options_.bookmark_interval;
    while (!w_.Stopping() && !w_.ClientGone() && std::chrono::steady_clock::now() < deadline) {
      auto changes = s_.store_->EventsAfter(rv, r.storage_resource(), 500ms);
      if (!changes.ok()) {
        if (changes.status().code() == StatusCode::kExpired) {
          // The client relists (client-go reflector on 410 Expired).
          send("ERROR", StatusJson({410, "Expired", changes.status().message(), {}}));
        }
        return;
      }
      for (const auto& e : changes->events) {
        if (!want_ns.empty() && e.key.namespace_ != want_ns) continue;
        if (!Selected(*filter, *e.object)) continue;
        if (!send(EventTypeName(e.type), *e.object)) return;
      }
      rv = changes->scanned_to;
      if (bookmarks && std::chrono::steady_clock::now() >= next_bookmark) {
        // A bookmark says "you have seen everything up to here" so a resumed watch starts late.
        if (!send("BOOKMARK", {{"kind", r.kind},
                               {"apiVersion", r.api_version()},
                               {"metadata", {{"resourceVersion", std::to_string(rv)}}}}))
          return;
        next_bookmark = std::chrono::steady_clock::now() + s_.options_.bookmark_interval;
      }
    }
  }

  void Logs(const ResourceInfo& r, const std::string& ns, const std::string& name) {
    auto pod = s_.store_->Get({r.storage_resource(), ns, name});
    if (!pod) return Reply(ErrorResponse(NotFoundError(r, name)));
    std::string container = req_.QueryValue("container").value_or("");
    if (container.empty() && (*pod)["spec"].contains("containers") &&
        !(*pod)["spec"]["containers"].empty())
      container = (*pod)["spec"]["containers"][0].value("name", "");
    std::string path = s_.options_.log_path ? s_.options_.log_path(ns, name, container) : "";
    // The kubelet keeps the output of the container's previous run beside the current one.
    if (!path.empty() && req_.QueryValue("previous").value_or("") == "true") path += ".previous";
    std::ifstream in(path, std::ios::binary);
    if (path.empty() || !in)
      return Reply(ErrorResponse(BadRequest("container \"" + container + "\" in pod \"" + name +
                                            "\" is waiting to start: no logs yet")));
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (auto tail = req_.QueryValue("tailLines"); tail && !tail->empty()) {
      int64_t n = std::atoll(tail->c_str());
      size_t pos = text.size();
      if (pos > 0 && text[pos - 1] == '\n') --pos;
      for (int64_t i = 0; i < n && pos != std::string::npos && pos > 0; ++i)
        pos = text.rfind('\n', pos - 1);
      if (pos != std::string::npos && pos < text.size() && n > 0 && text[pos] == '\n')
        text = text.substr(pos + 1);
    }
    bool follow = req_.QueryValue("follow").value_or("") == "true";
    http::Headers h;
    h.Set("Content-Type", "text/plain");
    if (!follow) {
      http::Response resp;
      resp.headers = h;
      resp.body = text;
      return Reply(resp);
    }
    if (!w_.StartStream(200, h).ok() || !w_.WriteChunk(text).ok()) return;
    // Follow: stream what the file grows by until the pod ends, the client leaves, or we stop.
    std::string chunk(65536, '\0');
    while (!w_.Stopping() && !w_.ClientGone()) {
      in.clear();
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      std::streamsize n = in.gcount();
      if (n > 0) {
        if (!w_.WriteChunk(std::string_view(chunk.data(), static_cast<size_t>(n))).ok()) return;
        continue;
      }
      auto now = s_.store_->Get({r.storage_resource(), ns, name});
      if (!now) return;
      std::string phase = (*now)["status"].value("phase", "");
      if (phase == "Succeeded" || phase == "Failed") return;
      std::this_thread::sleep_for(200ms);
    }
  }

  ApiServer& s_;
  const http::Request& req_;
  http::ResponseWriter& w_;
  std::vector<std::string> warnings_;
};

StatusOr<std::unique_ptr<ApiServer>> ApiServer::Start(ApiServerOptions options) {
  if (options.token.empty()) return InvalidArgument("token: required");
  std::unique_ptr<ApiServer> server(new ApiServer(std::move(options)));
  TIDAL_ASSIGN_OR_RETURN(server->store_,
                         Store::Open(server->options_.data_dir, server->options_.history_size));
  server->writer_ = std::make_unique<ObjectWriter>(*server->store_, server->registry_);
  server->writer_->RegisterStoredCrds();
  TIDAL_RETURN_IF_ERROR(server->Bootstrap());
  if (!server->options_.audit_log_path.empty()) {
    TIDAL_ASSIGN_OR_RETURN(server->audit_, AuditLog::Open(server->options_.audit_log_path));
  }
  http::ServerOptions http_options;
  http_options.port = server->options_.port;
  http_options.max_body_bytes = server->options_.max_body_bytes;
  TIDAL_ASSIGN_OR_RETURN(http_options.tls, http::TlsContext::Server(server->options_.cert_pem,
                                                                    server->options_.key_pem));
  http_options.on_error = [](int status, const std::string& message) {
    std::string reason = status == 413 ? "RequestEntityTooLarge" : "BadRequest";
    return JsonResponse(status, StatusJson({status, reason, message, {}}));
  };
  ApiServer* self = server.get();
  TIDAL_ASSIGN_OR_RETURN(
      server->http_,
      http::Server::Start(http_options, [self](const http::Request& req, http::ResponseWriter& w) {
        if (self->audit_) self->audit_->Record(req);
        self->Handle(req, w);
      }));
  return server;
}

ApiServer::~ApiServer() { Stop(); }

void ApiServer::Stop() {
  if (stopped_.exchange(true)) return;
  if (store_) store_->WakeWatchers();
  if (http_) http_->Stop();
}

Status ApiServer::Bootstrap() {
  // The namespaces every cluster has (kube-apiserver's system namespaces controller).
  auto namespaces = registry_.Find("", "v1", "namespaces");
  for (const char* ns : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
    if (store_->Get({"/namespaces", "", ns})) continue;
    ApiResult r =
        writer_->Create(*namespaces, "",
                        {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}},
                        WriteOptions{});
    if (!r.ok()) return Internal("creating namespace " + std::string(ns) + ": " + r.error->message);
  }
  return OkStatus();
}

void ApiServer::Handle(const http::Request& request, http::ResponseWriter& writer) {
  auto start = std::chrono::steady_clock::now();
  try {
    RequestContext(*this, request, writer).Run();
  } catch (const std::exception& e) {
    // A bug, not bad input: answer 500 and keep serving.
    writer.Send(JsonResponse(500, StatusJson({500, "InternalError", e.what(), {}}))).ok();
  }
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (request.QueryValue("watch").value_or("") != "true" && ms > 1000)
    Logger::Get().Log("warn", "slow request",
                      {{"method", request.method}, {"path", request.path}, {"ms", ms}});
}

}  // namespace tidal::local
