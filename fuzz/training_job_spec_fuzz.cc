// A TrainingJob's spec (api/training_job.h) from arbitrary YAML or JSON, the way a
// user's manifest reaches the operator: every violation is an InvalidArgument naming
// "spec.<field>", never a crash; an accepted spec has somewhere to run.
#include <sstream>
#include <string>

#include "api/training_job.h"
#include "common/yaml_json.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tidal;
  auto doc = ParseYaml(std::string(fuzz::Text(data, size)));
  if (!doc.ok()) return 0;
  const nlohmann::json& spec = doc->is_object() && doc->contains("spec") ? (*doc)["spec"] : *doc;
  auto parsed = api::ParseTrainingJobSpec(spec);
  if (!parsed.ok()) {
    // One violation per line, each naming its field: "spec.<path>: ..." (or "spec: ...").
    std::istringstream lines(parsed.status().message());
    std::string line;
    while (std::getline(lines, line))
      if (line.rfind("spec", 0) != 0)
        fuzz::Violated("training_job_spec", "a refusal names no spec field: " + line);
    return 0;
  }
  if (parsed->elastic.min_gpus > parsed->elastic.max_gpus)
    fuzz::Violated("training_job_spec", "minGPUs above maxGPUs accepted");
  (void)parsed->AllowedGpuCounts();
  return 0;
}
