// local/protobuf.cc
#include "local/protobuf.h"

#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <string_view>
#include <vector>

#include "common/base64.h"

namespace tidal::local {
namespace {

using nlohmann::json;

// One protobuf message: a walk over (field number, wire type, value) triples.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}

  struct Field {
    uint32_t number = 0;
    int wire_type = 0;
    uint64_t varint = 0;
    std::string_view bytes;  // length-delimited payload
  };

  // The next field; false at the end; an error for a malformed message.
  StatusOr<bool> Next(Field& field) {
    if (pos_ >= data_.size()) return false;
    TIDAL_ASSIGN_OR_RETURN(uint64_t key, Varint());
    field.number = static_cast<uint32_t>(key >> 3);
    field.wire_type = static_cast<int>(key & 7);
    switch (field.wire_type) {
      case 0: {
        TIDAL_ASSIGN_OR_RETURN(field.varint, Varint());
        return true;
      }
      case 1:
      case 5: {
        size_t n = field.wire_type == 1 ? 8 : 4;
        if (data_.size() - pos_ < n) return InvalidArgument("protobuf: truncated fixed field");
        pos_ += n;
        return true;
      }
      case 2: {
        TIDAL_ASSIGN_OR_RETURN(uint64_t n, Varint());
        if (n > data_.size() - pos_) return InvalidArgument("protobuf: truncated length field");
        field.bytes = data_.substr(pos_, n);
        pos_ += n;
        return true;
      }
      default:
        return InvalidArgument("protobuf: unsupported wire type " +
                               std::to_string(field.wire_type));
    }
  }

 private:
  StatusOr<uint64_t> Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) return InvalidArgument("protobuf: truncated varint");
      auto b = static_cast<uint8_t>(data_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    return InvalidArgument("protobuf: varint too long");
  }

  std::string_view data_;
  size_t pos_ = 0;
};

using FieldFn = std::function<Status(const Reader::Field&)>;

Status Walk(std::string_view data, const FieldFn& fn) {
  Reader reader(data);
  Reader::Field field;
  while (true) {
    TIDAL_ASSIGN_OR_RETURN(bool more, reader.Next(field));
    if (!more) return OkStatus();
    TIDAL_RETURN_IF_ERROR(fn(field));
  }
}

Status Expect(const Reader::Field& f, int wire_type, const char* name) {
  if (f.wire_type == wire_type) return OkStatus();
  return InvalidArgument(std::string("protobuf: field ") + name + " has the wrong wire type");
}

// map<string, string|bytes> entry: key = 1, value = 2.
Status MapEntry(const Reader::Field& f, json& map, bool bytes_value, const char* name) {
  TIDAL_RETURN_IF_ERROR(Expect(f, 2, name));
  std::string key, value;
  TIDAL_RETURN_IF_ERROR(Walk(f.bytes, [&](const Reader::Field& e) -> Status {
    if (e.number == 1) key = std::string(e.bytes);
    if (e.number == 2) value = std::string(e.bytes);
    return OkStatus();
  }));
  map[key] = bytes_value ? Base64Encode(value) : value;
  return OkStatus();
}

// meta/v1 Time: seconds = 1, nanos = 2 → RFC 3339; "" for the zero time.
std::string Time(std::string_view data) {
  int64_t seconds = 0;
  Walk(data, [&](const Reader::Field& f) -> Status {
    if (f.number == 1) seconds = static_cast<int64_t>(f.varint);
    return OkStatus();
  }).ok();
  if (seconds == 0) return "";  // the zero Time: unset
  std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// meta/v1 ObjectMeta (apimachinery generated.proto field numbers).
StatusOr<json> ObjectMeta(std::string_view data) {
  json meta = json::object();
  static const char* kStrings[] = {nullptr,    "name", "generateName",   "namespace",
                                   "selfLink", "uid",  "resourceVersion"};
  TIDAL_RETURN_IF_ERROR(Walk(data, [&](const Reader::Field& f) -> Status {
    if (f.number >= 1 && f.number <= 6) {
      // Go's zero values (empty strings, 0, the zero Time) are what JSON omits.
      TIDAL_RETURN_IF_ERROR(Expect(f, 2, kStrings[f.number]));
      if (!f.bytes.empty()) meta[kStrings[f.number]] = std::string(f.bytes);
    } else if (f.number == 7) {
      if (f.varint) meta["generation"] = static_cast<int64_t>(f.varint);
    } else if (f.number == 8 || f.number == 9) {
      TIDAL_RETURN_IF_ERROR(Expect(f, 2, "timestamp"));
      if (std::string t = Time(f.bytes); !t.empty())
        meta[f.number == 8 ? "creationTimestamp" : "deletionTimestamp"] = t;
    } else if (f.number == 10) {
      meta["deletionGracePeriodSeconds"] = static_cast<int64_t>(f.varint);
    } else if (f.number == 11 || f.number == 12) {
      const char* name = f.number == 11 ? "labels" : "annotations";
      if (!meta.contains(name)) meta[name] = json::object();
      TIDAL_RETURN_IF_ERROR(MapEntry(f, meta[name], false, name));
    } else if (f.number == 13) {
      TIDAL_RETURN_IF_ERROR(Expect(f, 2, "ownerReferences"));
      json ref = json::object();
      TIDAL_RETURN_IF_ERROR(Walk(f.bytes, [&](const Reader::Field& r) -> Status {
        switch (r.number) {
          case 1:
            ref["kind"] = std::string(r.bytes);
            break;
          case 3:
            ref["name"] = std::string(r.bytes);
            break;
          case 4:
            ref["uid"] = std::string(r.bytes);
            break;
          case 5:
            ref["apiVersion"] = std::string(r.bytes);
            break;
          case 6:
            ref["controller"] = r.varint != 0;
            break;
          case 7:
            ref["blockOwnerDeletion"] = r.varint != 0;
            break;
          default:
            break;
        }
        return OkStatus();
      }));
      meta["ownerReferences"].push_back(ref);
    } else if (f.number == 14) {
      TIDAL_RETURN_IF_ERROR(Expect(f, 2, "finalizers"));
      meta["finalizers"].push_back(std::string(f.bytes));
    }
    // managedFields (17) and anything newer are dropped: the server keeps no field managers.
    return OkStatus();
  }));
  return meta;
}

// Decodes the fields of one kind into `object`: metadata = 1 everywhere, the rest per `body`
// (which writes into `object` too).
Status Object(std::string_view raw, json& object, const FieldFn& body) {
  return Walk(raw, [&](const Reader::Field& f) -> Status {
    if (f.number == 1) {
      TIDAL_RETURN_IF_ERROR(Expect(f, 2, "metadata"));
      TIDAL_ASSIGN_OR_RETURN(object["metadata"], ObjectMeta(f.bytes));
      return OkStatus();
    }
    return body(f);
  });
}

// meta/v1 DeleteOptions: gracePeriodSeconds = 1, preconditions = 2 (uid = 1,
// resourceVersion = 2), orphanDependents = 3, propagationPolicy = 4, dryRun = 5.
Status DeleteOptions(std::string_view raw, json& object) {
  return Walk(raw, [&](const Reader::Field& f) -> Status {
    switch (f.number) {
      case 1:
        object["gracePeriodSeconds"] = static_cast<int64_t>(f.varint);
        break;
      case 2:
        return Walk(f.bytes, [&](const Reader::Field& p) -> Status {
          if (p.number == 1) object["preconditions"]["uid"] = std::string(p.bytes);
          if (p.number == 2) object["preconditions"]["resourceVersion"] = std::string(p.bytes);
          return OkStatus();
        });
      case 3:
        object["orphanDependents"] = f.varint != 0;
        break;
      case 4:
        object["propagationPolicy"] = std::string(f.bytes);
        break;
      case 5:
        object["dryRun"].push_back(std::string(f.bytes));
        break;
      default:
        break;
    }
    return OkStatus();
  });
}

}  // namespace

StatusOr<json> DecodeKubeProtobuf(const std::string& body) {
  static const std::string kMagic("k8s\0", 4);
  if (body.compare(0, kMagic.size(), kMagic) != 0)
    return InvalidArgument("protobuf body without the \"k8s\\0\" envelope prefix");
  std::string api_version, kind;
  std::string_view raw;
  TIDAL_RETURN_IF_ERROR(
      Walk(std::string_view(body).substr(kMagic.size()), [&](const Reader::Field& f) -> Status {
        if (f.number == 1) {  // TypeMeta: apiVersion = 1, kind = 2
          TIDAL_RETURN_IF_ERROR(Expect(f, 2, "typeMeta"));
          return Walk(f.bytes, [&](const Reader::Field& t) -> Status {
            if (t.number == 1) api_version = std::string(t.bytes);
            if (t.number == 2) kind = std::string(t.bytes);
            return OkStatus();
          });
        }
        if (f.number == 2) {
          TIDAL_RETURN_IF_ERROR(Expect(f, 2, "raw"));
          raw = f.bytes;
        }
        return OkStatus();
      }));
  json object = {{"apiVersion", api_version}, {"kind", kind}};
  // Flat kinds: their fields after metadata, by number (k8s.io/api core/v1 generated.proto).
  enum FieldType { kStringMap, kBytesMap, kString, kBool };
  struct FieldSpec {
    uint32_t number;
    const char* name;
    FieldType type;
  };
  static const std::map<std::string, std::vector<FieldSpec>> kFlatKinds = {
      {"Secret",
       {{2, "data", kBytesMap},
        {3, "type", kString},
        {4, "stringData", kStringMap},
        {5, "immutable", kBool}}},
      {"ConfigMap",
       {{2, "data", kStringMap}, {3, "binaryData", kBytesMap}, {4, "immutable", kBool}}},
  };
  if (auto flat = kFlatKinds.find(kind); api_version == "v1" && flat != kFlatKinds.end()) {
    TIDAL_RETURN_IF_ERROR(Object(raw, object, [&](const Reader::Field& f) -> Status {
      for (const FieldSpec& spec : flat->second) {
        if (spec.number != f.number) continue;
        switch (spec.type) {
          case kStringMap:
          case kBytesMap:
            return MapEntry(f, object[spec.name], spec.type == kBytesMap, spec.name);
          case kString:
            if (!f.bytes.empty()) object[spec.name] = std::string(f.bytes);
            break;
          case kBool:
            object[spec.name] = f.varint != 0;
            break;
        }
      }
      return OkStatus();
    }));
    return object;
  }
  if (api_version == "v1" && kind == "Namespace") {
    TIDAL_RETURN_IF_ERROR(Object(raw, object, [&](const Reader::Field& f) -> Status {
      if (f.number == 2)  // spec: finalizers = 1
        return Walk(f.bytes, [&](const Reader::Field& s) -> Status {
          if (s.number == 1) object["spec"]["finalizers"].push_back(std::string(s.bytes));
          return OkStatus();
        });
      return OkStatus();
    }));
    return object;
  }
  if (kind == "DeleteOptions") {  // meta/v1, under whichever group the client names
    object = {{"apiVersion", api_version}, {"kind", kind}};
    TIDAL_RETURN_IF_ERROR(DeleteOptions(raw, object));
    return object;
  }
  if (kind == "Eviction") {  // policy/v1: metadata = 1, deleteOptions = 2
    object = {{"apiVersion", api_version}, {"kind", kind}};
    TIDAL_RETURN_IF_ERROR(Object(raw, object, [&](const Reader::Field& f) -> Status {
      if (f.number != 2) return OkStatus();
      TIDAL_RETURN_IF_ERROR(Expect(f, 2, "deleteOptions"));
      object["deleteOptions"] = json::object();
      return DeleteOptions(f.bytes, object["deleteOptions"]);
    }));
    return object;
  }
  return FailedPrecondition("protobuf bodies of " + (api_version.empty() ? "?" : api_version) +
                            " " + (kind.empty() ? "?" : kind) + " are not decoded");
}

}  // namespace tidal::local
