// contract/wire.h — the plain contract types (worker_status.h) to and from worker.proto's
// messages: the gRPC edge, the only place the two meet. For the client (client.cc) and the
// worker's service; the operator never includes it (tools/check_layers.py says so).
#pragma once

#include <optional>

#include "api/worker_phase.h"
#include "common/status.h"
#include "contract/worker_status.h"
#include "tidal/worker/v1/worker.pb.h"

namespace tidal::contract {

::tidal::worker::v1::Phase ToWire(api::WorkerPhase phase);
// None for PHASE_UNSPECIFIED or a value this build does not know (a newer worker's).
std::optional<api::WorkerPhase> FromWire(::tidal::worker::v1::Phase phase);

void ToWire(const CheckpointInfo& in, ::tidal::worker::v1::CheckpointInfo* out);
CheckpointInfo FromWire(const ::tidal::worker::v1::CheckpointInfo& in);
void ToWire(const StepEvent& in, ::tidal::worker::v1::StepEvent* out);
StepEvent FromWire(const ::tidal::worker::v1::StepEvent& in);
void ToWire(const WorkerStatus& in, ::tidal::worker::v1::WorkerStatus* out);
// FAILED_PRECONDITION for a phase this build does not know: nothing may be decided on it.
StatusOr<WorkerStatus> FromWire(const ::tidal::worker::v1::WorkerStatus& in);

}  // namespace tidal::contract
