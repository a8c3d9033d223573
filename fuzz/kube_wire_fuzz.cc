// What clients send `tidal local` besides JSON: Kubernetes protobuf bodies
// (local/protobuf.h) and label and field selectors in query strings
// (kube/labels.h, local/selectors.h). Fields: a protobuf body, a label
// selector, a field selector. A parsed label selector prints to a form that parses back to the
// same selector.
#include "fuzz/fuzz_input.h"
#include "local/protobuf.h"
#include "local/selectors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tidal;
  const auto fields = fuzz::Fields(data, size, 3);
  auto object = local::DecodeKubeProtobuf(fields[0]);
  if (object.ok()) (void)object->dump();
  auto labels = local::ParseLabelSelector(fields[1]);
  if (labels.ok()) {
    const std::string text = labels->ToString();
    auto again = local::ParseLabelSelector(text);
    if (!again.ok() || again->ToString() != text)
      fuzz::Violated("kube_wire", "label selector \"" + text + "\" does not parse back");
    (void)labels->Matches(nlohmann::json{{"app", "tidal"}, {"tier", ""}});
  }
  auto field = local::ParseFieldSelector(fields[2]);
  if (field.ok()) (void)local::Matches(*field, {{"metadata", {{"name", "a"}, {"namespace", "b"}}}});
  return 0;
}
