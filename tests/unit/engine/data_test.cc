// The collate step: packed rows keep documents apart (positions restart, attention closed
// across documents) so the packed loss and LoRA gradients equal the unpacked ones; the
// tokenizer-fits-the-model check; the sample data through tidal-prep's store into rows.
#include "worker/engine/data.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "tests/unit/engine/test_util.h"
#include "worker/engine/job_fit.h"
#include "worker/engine/model.h"

namespace tidal::engine {
namespace {

// A row holding `docs` (token lists) back to back; every next token trains.
PackedRow Row(const std::vector<std::vector<uint32_t>>& docs) {
  PackedRow row;
  int32_t d = 0;
  for (const auto& doc : docs) {
    for (size_t i = 0; i < doc.size(); ++i) {
      row.tokens.push_back(doc[i]);
      row.targets.push_back(i + 1 < doc.size() ? static_cast<int32_t>(doc[i + 1]) : -100);
      row.positions.push_back(static_cast<int32_t>(i));
      row.documents.push_back(d);
    }
    ++d;
  }
  return row;
}

std::vector<int64_t> Values(const torch::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

TEST(CollateTest, PositionsRestartAndAttentionStaysInsideEachDocument) {
  std::vector<PackedRow> rows{Row({{1, 2, 3}, {4, 5}}), Row({{6, 7}})};
  MicroBatch b = Collate(rows);
  ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(Values(b.positions[0]), (std::vector<int64_t>{0, 1, 2, 0, 1}));
  EXPECT_EQ(Values(b.targets[0]), (std::vector<int64_t>{2, 3, -100, 5, -100}));
  EXPECT_EQ(Values(b.targets[1]), (std::vector<int64_t>{7, -100, -100, -100, -100}));
  EXPECT_EQ(b.tokens, 7);
  EXPECT_EQ(b.target_tokens, 4);
  ASSERT_TRUE(b.attention.defined());
  auto a = b.attention[0][0];
  EXPECT_TRUE(a[1][0].item<bool>());   // same document, earlier
  EXPECT_FALSE(a[0][1].item<bool>());  // later: causal
  EXPECT_FALSE(a[3][2].item<bool>());  // the previous document
  EXPECT_TRUE(a[4][3].item<bool>());
  // Rows of one document each need no mask.
  std::vector<PackedRow> single{Row({{1, 2, 3}})};
  EXPECT_FALSE(Collate(single).attention.defined());
}

// The summed loss and the LoRA gradients of `rows` through every block of `model`.
std::pair<double, std::vector<torch::Tensor>> LossAndLoraGrads(
    const DecoderModel& model, const std::vector<std::vector<torch::Tensor>>& params,
    std::vector<PackedRow> rows) {
  MicroBatch b = Collate(rows);
  auto [cos, sin] = model.RopeTables(64, torch::kCPU);
  ForwardContext ctx;
  ctx.tokens = b.inputs;
  ctx.targets = b.targets;
  const int64_t n = b.inputs.size(0), seq = b.inputs.size(1);
  ctx.rope_cos = cos.index_select(0, b.positions.reshape({-1})).view({n, 1, seq, -1});
  ctx.rope_sin = sin.index_select(0, b.positions.reshape({-1})).view({n, 1, seq, -1});
  ctx.attention = b.attention;
  torch::Tensor x;
  for (size_t blk = 0; blk < model.blocks().size(); ++blk)
    x = model.ForwardBlock(static_cast<int64_t>(blk), params[blk], x, ctx, params[0][0]);
  for (const auto& block : params)
    for (const auto& p : block)
      if (p.grad().defined()) p.mutable_grad().zero_();
  x.backward();
  std::vector<torch::Tensor> grads;
  for (size_t blk = 0; blk < params.size(); ++blk)
    for (size_t i = 0; i < params[blk].size(); ++i)
      if (model.blocks()[blk].params[i].trainable) grads.push_back(params[blk][i].grad().clone());
  return {x.item<double>(), grads};
}

TEST(CollateTest, PackedLossAndLoraGradientsEqualTheDocumentsRunAlone) {
  auto config = *PresetModelConfig("tiny");
  config.tie_word_embeddings = true;
  LoraSpec lora;
  lora.rank = 4;
  lora.alpha = 8;
  lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "down_proj"};
  DecoderModel model(config, lora);
  torch::manual_seed(0);
  std::vector<std::vector<torch::Tensor>> params;
  for (const BlockSpec& block : model.blocks()) {
    params.emplace_back();
    for (const ParamSpec& spec : block.params) {
      auto t = model.InitialValue(spec, 7);
      // LoRA B starts at zero; make the adapters matter.
      if (spec.name.find("lora_B") != std::string::npos) t = torch::randn(t.sizes()) * 0.05;
      params.back().push_back(t.set_requires_grad(spec.trainable));
    }
  }
  std::vector<std::vector<uint32_t>> docs{{5, 17, 300, 42, 9, 11, 260, 3, 4},
                                          {100, 101, 102, 103, 104, 105},
                                          {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}};
  auto [packed_loss, packed_grads] = LossAndLoraGrads(model, params, {Row(docs)});
  double alone_loss = 0;
  std::vector<torch::Tensor> alone_grads;
  for (const auto& doc : docs) {
    auto [loss, grads] = LossAndLoraGrads(model, params, {Row({doc})});
    alone_loss += loss;
    if (alone_grads.empty())
      alone_grads = grads;
    else
      for (size_t i = 0; i < grads.size(); ++i) alone_grads[i] += grads[i];
  }
  EXPECT_NEAR(packed_loss, alone_loss, 1e-5 * std::abs(alone_loss));
  ASSERT_EQ(packed_grads.size(), alone_grads.size());
  ASSERT_FALSE(packed_grads.empty());
  for (size_t i = 0; i < packed_grads.size(); ++i) {
    const double scale = alone_grads[i].abs().max().item<double>() + 1e-12;
    EXPECT_LE((packed_grads[i] - alone_grads[i]).abs().max().item<double>(), 1e-5 * scale)
        << "LoRA gradient " << i;
  }
}

TEST(TokenizerFitTest, ATokenizerThatDoesNotFitTheModelIsRefusedNamingBothSides) {
  ModelConfig model = *PresetModelConfig("tiny");  // vocab 512
  model.bos_token_id = 1;
  model.eos_token_ids = {2, 3};
  TokenizerFacts t;
  t.description = "BPE (byte-level), 500 ids";
  t.vocab_size = 500;
  t.max_id = 499;
  t.bos_id = 1;
  t.eos_id = 3;
  EXPECT_TRUE(CheckTokenizerFitsModel(t, model, "m").ok());
  auto refused = [&](TokenizerFacts bad, const std::string& words) {
    Status s = CheckTokenizerFitsModel(bad, model, "/models/m");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << words;
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("/models/m"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("BPE (byte-level)"), std::string::npos) << s.message();
  };
  auto big_id = t;
  big_id.max_id = 512;
  refused(big_id, "token id 512");
  auto big_vocab = t;
  big_vocab.vocab_size = 129280;
  refused(big_vocab, "129280 ids");
  // A bos other than config.json's is the tokenizer's to choose (DeepSeek-R1-Distill-Qwen:
  // config 151643, tokenizer 151646; eos 151643 in both): accepted.
  auto bos = t;
  bos.bos_id = 0;
  EXPECT_TRUE(CheckTokenizerFitsModel(bos, model, "m").ok());
  auto eos = t;
  eos.eos_id = 0;
  refused(eos, "eos_token_id [2,3]");
}

TEST(TrainingRowsTest, TheSampleTextGoesThroughTidalPrepIntoRowsThatDependOnlyOnTheCursor) {
  auto config = testing::TinyConfig(0);
  auto stores = [] {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(testing::PreparedDir()))
      n += e.is_directory();
    return n;
  };
  auto a = testing::OpenRows(config);
  const size_t prepared = stores();
  auto b = testing::OpenRows(config);  // the same store: prepared once, found the second time
  ASSERT_TRUE(a && b);
  EXPECT_EQ(stores(), prepared) << "the second open wrote another store";
  EXPECT_EQ(a->dataset().tokenizer.kind, "bytes");
  EXPECT_EQ(a->dataset().samples, 3382u);
  EXPECT_GT(a->rows(), 100u);
  for (uint64_t k : {uint64_t{0}, uint64_t{17}, a->rows() + 3}) {
    auto x = a->Sequence(k);
    auto y = b->Sequence(k);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(x->tokens, y->tokens);
    EXPECT_LE(x->tokens.size(), 32u);
    EXPECT_EQ(x->tokens.front(), 256u);  // each document begins with BOS
  }
}

}  // namespace
}  // namespace tidal::engine
