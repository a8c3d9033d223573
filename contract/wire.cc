// contract/wire.cc
#include "contract/wire.h"

namespace tidal::contract {

namespace pb = ::tidal::worker::v1;

pb::Phase ToWire(api::WorkerPhase phase) {
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

std::optional<api::WorkerPhase> FromWire(pb::Phase phase) {
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

void ToWire(const CheckpointInfo& in, pb::CheckpointInfo* out) {
  out->set_step(in.step);
  out->set_kind(in.kind);
  out->set_uri(in.uri);
  out->set_unix_millis(in.unix_millis);
}

CheckpointInfo FromWire(const pb::CheckpointInfo& in) {
  return {in.step(), in.kind(), in.uri(), in.unix_millis()};
}

void ToWire(const StepEvent& in, pb::StepEvent* out) {
  out->set_generation(in.generation);
  out->set_step(in.step);
  out->set_loss(in.loss);
  out->set_learning_rate(in.learning_rate);
  out->set_grad_norm(in.grad_norm);
  out->set_tokens_per_second(in.tokens_per_second);
  out->set_seconds(in.seconds);
  out->set_world_size(in.world_size);
  out->set_unix_millis(in.unix_millis);
  out->set_skipped(in.skipped);
  if (in.gpu_utilization_percent) out->set_gpu_utilization_percent(*in.gpu_utilization_percent);
  out->set_data_wait_seconds(in.data_wait_seconds);
}

StepEvent FromWire(const pb::StepEvent& in) {
  StepEvent e;
  e.generation = in.generation();
  e.step = in.step();
  e.loss = in.loss();
  e.learning_rate = in.learning_rate();
  e.grad_norm = in.grad_norm();
  e.tokens_per_second = in.tokens_per_second();
  e.seconds = in.seconds();
  e.world_size = in.world_size();
  e.unix_millis = in.unix_millis();
  e.skipped = in.skipped();
  if (in.has_gpu_utilization_percent()) e.gpu_utilization_percent = in.gpu_utilization_percent();
  e.data_wait_seconds = in.data_wait_seconds();
  return e;
}

void ToWire(const WorkerStatus& in, pb::WorkerStatus* out) {
  out->set_phase(ToWire(in.phase));
  out->set_generation(in.generation);
  out->set_rank(in.rank);
  out->set_world_size(in.world_size);
  out->set_step(in.step);
  out->set_max_steps(in.max_steps);
  out->set_loss(in.loss);
  out->set_tokens_per_second(in.tokens_per_second);
  out->set_learning_rate(in.learning_rate);
  out->set_grad_norm(in.grad_norm);
  if (in.gpu_utilization_percent) out->set_gpu_utilization_percent(*in.gpu_utilization_percent);
  if (in.gpu_memory_used_bytes) out->set_gpu_memory_used_bytes(*in.gpu_memory_used_bytes);
  if (in.last_checkpoint) ToWire(*in.last_checkpoint, out->mutable_last_checkpoint());
  out->set_last_error(in.last_error);
  out->set_last_error_permanent(in.last_error_permanent);
  out->set_job(in.job);
  out->set_uptime_millis(in.uptime_millis);
  for (const StepEvent& e : in.recent_steps) ToWire(e, out->add_recent_steps());
  if (in.live_checkpoint) ToWire(*in.live_checkpoint, out->mutable_live_checkpoint());
  for (const HeldPart& h : in.held_parts) {
    pb::HeldPart* part = out->add_held_parts();
    part->set_generation(h.generation);
    part->set_rank(h.rank);
    part->set_world_size(h.world_size);
    part->set_step(h.step);
  }
  if (in.prepared_engine) {
    pb::PreparedEngine* p = out->mutable_prepared_engine();
    p->set_generation(in.prepared_engine->generation);
    p->set_rank(in.prepared_engine->rank);
    p->set_world_size(in.prepared_engine->world_size);
    p->set_ready(in.prepared_engine->ready);
    p->set_error(in.prepared_engine->error);
  }
  if (in.checkpoint_interval) {
    const CheckpointIntervalPlan& plan = *in.checkpoint_interval;
    pb::CheckpointIntervalPlan* c = out->mutable_checkpoint_interval();
    c->set_full_every_steps(plan.full_every_steps);
    c->set_reason(plan.reason);
    c->set_cost_seconds(plan.cost_seconds);
    c->set_step_seconds(plan.step_seconds);
    c->set_mtbf_seconds(plan.mtbf_seconds);
    c->set_failures(plan.failures);
    c->set_trained_seconds(plan.trained_seconds);
    c->set_optimum_seconds(plan.optimum_seconds);
    c->set_expected_waste(plan.expected_waste);
  }
  if (in.resumed_from) ToWire(*in.resumed_from, out->mutable_resumed_from());
  for (const std::string& c : in.skipped_checkpoints) out->add_skipped_checkpoints(c);
}

StatusOr<WorkerStatus> FromWire(const pb::WorkerStatus& in) {
  const std::optional<api::WorkerPhase> phase = FromWire(in.phase());
  if (!phase)
    return FailedPrecondition("the worker reports phase " + std::to_string(in.phase()) +
                              ", which this operator does not know");
  WorkerStatus s;
  s.phase = *phase;
  s.generation = in.generation();
  s.rank = in.rank();
  s.world_size = in.world_size();
  s.step = in.step();
  s.max_steps = in.max_steps();
  s.loss = in.loss();
  s.tokens_per_second = in.tokens_per_second();
  s.learning_rate = in.learning_rate();
  s.grad_norm = in.grad_norm();
  if (in.has_gpu_utilization_percent()) s.gpu_utilization_percent = in.gpu_utilization_percent();
  if (in.has_gpu_memory_used_bytes()) s.gpu_memory_used_bytes = in.gpu_memory_used_bytes();
  if (in.has_last_checkpoint()) s.last_checkpoint = FromWire(in.last_checkpoint());
  s.last_error = in.last_error();
  s.last_error_permanent = in.last_error_permanent();
  s.job = in.job();
  s.uptime_millis = in.uptime_millis();
  for (const pb::StepEvent& e : in.recent_steps()) s.recent_steps.push_back(FromWire(e));
  if (in.has_live_checkpoint()) s.live_checkpoint = FromWire(in.live_checkpoint());
  for (const pb::HeldPart& h : in.held_parts())
    s.held_parts.push_back({h.generation(), h.rank(), h.world_size(), h.step()});
  if (in.has_prepared_engine()) {
    const pb::PreparedEngine& p = in.prepared_engine();
    s.prepared_engine =
        PreparedEngine{p.generation(), p.rank(), p.world_size(), p.ready(), p.error()};
  }
  if (in.has_checkpoint_interval()) {
    const pb::CheckpointIntervalPlan& c = in.checkpoint_interval();
    s.checkpoint_interval =
        CheckpointIntervalPlan{c.full_every_steps(), c.reason(),          c.cost_seconds(),
                               c.step_seconds(),     c.mtbf_seconds(),    c.failures(),
                               c.trained_seconds(),  c.optimum_seconds(), c.expected_waste()};
  }
  if (in.has_resumed_from()) s.resumed_from = FromWire(in.resumed_from());
  s.skipped_checkpoints.assign(in.skipped_checkpoints().begin(), in.skipped_checkpoints().end());
  return s;
}

}  // namespace tidal::contract
