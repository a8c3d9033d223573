// api/worker_phase.h — where a worker is in its life (worker.proto Phase, DESIGN.md §4): the one
// enum the worker's runtime keeps and the operator decides on. Converted to and from the proto
// enum at the gRPC edge only (contract/wire.h).
//
//   Waiting        started, no generation yet (or prepared ahead for one)
//   Joining        in a Rendezvous: forming the process group, reading its state
//   Running        training
//   Checkpointing  saving a requested checkpoint
//   Paused         held at a step boundary with a checkpoint of it (a barrier)
//   Failed         its generation ended in error; it can join the next one
//   Succeeded      trained to maxSteps
#pragma once

namespace tidal::api {

enum class WorkerPhase {
  kWaiting,
  kJoining,
  kRunning,
  kCheckpointing,
  kPaused,
  kFailed,
  kSucceeded
};

inline const char* WorkerPhaseName(WorkerPhase phase) {
  switch (phase) {
    case WorkerPhase::kWaiting:
      return "Waiting";
    case WorkerPhase::kJoining:
      return "Joining";
    case WorkerPhase::kRunning:
      return "Running";
    case WorkerPhase::kCheckpointing:
      return "Checkpointing";
    case WorkerPhase::kPaused:
      return "Paused";
    case WorkerPhase::kFailed:
      return "Failed";
    case WorkerPhase::kSucceeded:
      return "Succeeded";
  }
  return "Unknown";
}

}  // namespace tidal::api
