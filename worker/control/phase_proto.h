// worker/control/phase_proto.h — api::WorkerPhase to and from worker.proto's Phase: the gRPC
// edge, the only place the two meet.
#pragma once

#include <optional>

#include "api/worker_phase.h"
#include "tidal/worker/v1/worker.pb.h"

namespace tidal::worker {

inline ::tidal::worker::v1::Phase ToProto(api::WorkerPhase phase) {
  namespace pb = ::tidal::worker::v1;
  switch (phase) {
    case api::WorkerPhase::kWaiting:
      return pb::WAITING;
    case api::WorkerPhase::kJoining:
      return pb::JOINING;
    case api::WorkerPhase::kRunning:
      return pb::RUNNING;
    case api::WorkerPhase::kCheckpointing:
      return pb::CHECKPOINTING;
    case api::WorkerPhase::kPaused:
      return pb::PAUSED;
    case api::WorkerPhase::kFailed:
      return pb::FAILED;
    case api::WorkerPhase::kSucceeded:
      return pb::SUCCEEDED;
  }
  return pb::PHASE_UNSPECIFIED;
}

// None for PHASE_UNSPECIFIED or a value this build does not know (a newer worker's).
inline std::optional<api::WorkerPhase> FromProto(::tidal::worker::v1::Phase phase) {
  namespace pb = ::tidal::worker::v1;
  switch (phase) {
    case pb::WAITING:
      return api::WorkerPhase::kWaiting;
    case pb::JOINING:
      return api::WorkerPhase::kJoining;
    case pb::RUNNING:
      return api::WorkerPhase::kRunning;
    case pb::CHECKPOINTING:
      return api::WorkerPhase::kCheckpointing;
    case pb::PAUSED:
      return api::WorkerPhase::kPaused;
    case pb::FAILED:
      return api::WorkerPhase::kFailed;
    case pb::SUCCEEDED:
      return api::WorkerPhase::kSucceeded;
    default:
      return std::nullopt;
  }
}

}  // namespace tidal::worker
