// local/protobuf.h — decodes the Kubernetes protobuf request bodies that real clients
// send for built-in kinds even when the server answers JSON: client-go's typed clients (Helm's
// release storage, `kubectl create secret|configmap|namespace`) POST and PUT
// `application/vnd.kubernetes.protobuf`. The envelope is "k8s\0" + runtime.Unknown{typeMeta,
// raw}; raw is the object in the wire format of k8s.io/api's generated.proto. Only the kinds
// those clients write are known (Secret, ConfigMap, Namespace, DeleteOptions); others are refused,
// and the server answers 415 as before. Pure: no I/O.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::local {

// The object as the JSON the API would have received; InvalidArgument for a malformed body,
// FailedPrecondition for a kind this decoder does not know.
StatusOr<nlohmann::json> DecodeKubeProtobuf(const std::string& body);

}  // namespace tidal::local
