// Every mixer and FFN kind's forward FLOPs per token (docs/flops.md) against a count written out
// here from the layer's formulas, at shapes where each term has its own size (D = 64, H = 4, d_h =
// 16, M = 96, context S = 32), so a missing or doubled term changes the total. The numbers below
// are products of the shape numbers, written out by hand, not calls into the layers' code.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "cemfrac/layers/registry.h"
#include "cemfrac/model/layer_factory.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/model/model_config.h"

namespace cemfrac {
namespace {

constexpr int64_t kS = 32;

ModelConfig flops_base() {
  ModelConfig c;
  c.vocab_size = 50;
  c.d_model = 64;
  c.n_layers = 1;
  c.n_heads = 4;
  c.d_ff = 96;
  c.context = 48;
  return c;
}

double mixer_flops(const ModelConfig& c) {
  return make_mixer(c, 0, torch::kMeta)->forward_flops_per_token(kS);
}
double ffn_flops(const ModelConfig& c) {
  return make_ffn(c, 0, torch::kMeta)->forward_flops_per_token();
}

TEST(Flops, Mha) {
  ModelConfig c = flops_base();
  // qkv 2*64*192, out 2*64*64, scores + read-out 2*2*64*32
  EXPECT_DOUBLE_EQ(mixer_flops(c), 24576.0 + 8192.0 + 8192.0);
  c.n_kv_heads = 2;  // qkv 64 + 2*32 rows
  EXPECT_DOUBLE_EQ(mixer_flops(c), 2.0 * 64 * 128 + 8192.0 + 8192.0);
}

TEST(Flops, SparseAttentionCountsTheDenseProduct) {
  ModelConfig c = flops_base();
  c.mixer = "sparse_attention";
  EXPECT_DOUBLE_EQ(mixer_flops(c), 24576.0 + 8192.0 + 8192.0);
}

TEST(Flops, SynthesizerDense) {
  ModelConfig c = flops_base();
  c.mixer = "synthesizer_dense";
  // w_1 2*64*64, logits 2*64*32, w_v 2*64*64, read-out 2*64*32, w_o 2*64*64
  EXPECT_DOUBLE_EQ(mixer_flops(c), 8192.0 + 4096.0 + 8192.0 + 4096.0 + 8192.0);
  c.cofrgenet.synth_hidden = 128;  // w_1 2*128*64, logits 2*128*32
  EXPECT_DOUBLE_EQ(mixer_flops(c), 16384.0 + 8192.0 + 8192.0 + 4096.0 + 8192.0);
}

TEST(Flops, CAttnM) {
  ModelConfig c = flops_base();
  c.mixer = "cattn_m";
  c.cofrgenet.m_ladders = 3;
  c.cofrgenet.m_depth = 2;
  c.cofrgenet.m_heads = 2;
  // ladder inputs 2*64*(2*3), logits 2*2*3*32, w_v 2*64*64, read-out 2*64*32
  EXPECT_DOUBLE_EQ(mixer_flops(c), 768.0 + 384.0 + 8192.0 + 4096.0);
  c.cofrgenet.m_out_proj = true;  // + w_o 2*64*64
  EXPECT_DOUBLE_EQ(mixer_flops(c), 768.0 + 384.0 + 8192.0 + 4096.0 + 8192.0);
}

TEST(Flops, CAttnU) {
  ModelConfig c = flops_base();
  c.mixer = "cattn_u";
  c.cofrgenet.u_depth = 3;
  // position weights 2 ensembles * 3 depths * 64 channels * 2, mixing 2 ensembles * 2*64*32
  EXPECT_DOUBLE_EQ(mixer_flops(c), 768.0 + 8192.0);
}

TEST(Flops, CemAttention) {
  ModelConfig c = flops_base();
  c.mixer = "cem_attention";
  // keys 2*64*64 once; per step queries + W_Q^T 2*2*64*64, scores + read-out 2*2*64*32
  const double keys = 8192.0, step = 16384.0 + 8192.0;
  EXPECT_DOUBLE_EQ(mixer_flops(c), keys + step);
  c.cem.steps = 3;
  EXPECT_DOUBLE_EQ(mixer_flops(c), keys + 3 * step);
  c.cem.recursion = CemRecursion::kGram;  // the same function: counted as the direct loop
  EXPECT_DOUBLE_EQ(mixer_flops(c), keys + 3 * step);
  c.cem.recursion_keys = CemRecursionKeys::kIterate;  // keys again at steps 2 and 3
  EXPECT_DOUBLE_EQ(mixer_flops(c), 3 * keys + 3 * step);
  c.cem.recursion_keys = CemRecursionKeys::kFixed;
  c.cem.steps = 2;
  c.cem.dlr = CemDiagonal::kPerHead;  // per step and head: delta x, read-out delta 2*64 each;
                                      // logits, P h 2*64*32 each
  const double per_head = 4 * (256.0 + 8192.0);
  EXPECT_DOUBLE_EQ(mixer_flops(c), keys + 2 * (step + per_head));
  c.cem.dlr_distance = true;  // key bias 2*64*4 once, query term 2*64 per step
  EXPECT_DOUBLE_EQ(mixer_flops(c), keys + 512.0 + 2 * (step + per_head + 128.0));
  c.cem.dlr_distance = false;
  c.cem.dlr = CemDiagonal::kShared;  // one diagonal instead of four
  EXPECT_DOUBLE_EQ(mixer_flops(c), keys + 2 * (step + 256.0 + 8192.0));
  c.cem.dlr = CemDiagonal::kNone;
  c.cem.precond = true;
  c.cem.precond_rank = 8;  // per step: diagonal 2*64, U^T g, V^T g, U (.), V (.) 4 * 2*64*8
  EXPECT_DOUBLE_EQ(mixer_flops(c), keys + 2 * (step + 128.0 + 4096.0));
  c.cem.precond_psd = true;  // U^T g, U (.)
  EXPECT_DOUBLE_EQ(mixer_flops(c), keys + 2 * (step + 128.0 + 2048.0));
}

TEST(Flops, GeluMlpAndSwiGlu) {
  ModelConfig c = flops_base();
  c.ffn = "gelu_mlp";
  EXPECT_DOUBLE_EQ(ffn_flops(c), 2 * 12288.0);  // 2*64*96 twice
  c.ffn = "swiglu";
  EXPECT_DOUBLE_EQ(ffn_flops(c), 3 * 12288.0);
}

TEST(Flops, CemMlp) {
  ModelConfig c = flops_base();
  c.ffn = "cem_mlp";
  // gate 2*64*96 once; per step W_U x and W_U^T 2*2*64*96
  EXPECT_DOUBLE_EQ(ffn_flops(c), 12288.0 + 24576.0);
  c.cem.steps = 2;
  c.cem.mlp_form = CemMlpForm::kB;
  EXPECT_DOUBLE_EQ(ffn_flops(c), 12288.0 + 2 * 24576.0);
  c.cem.precond = true;
  c.cem.precond_rank = 8;
  EXPECT_DOUBLE_EQ(ffn_flops(c), 12288.0 + 2 * (24576.0 + 128.0 + 4096.0));
}

TEST(Flops, Cffn) {
  ModelConfig c = flops_base();
  c.ffn = "cffn";
  c.cofrgenet.ladders = 3;
  c.cofrgenet.depth = 5;
  // gate 2*64*64, direct U 2*64*64, ladder inputs 2*5*3*64, read-out 2*3*64
  EXPECT_DOUBLE_EQ(ffn_flops(c), 8192.0 + 8192.0 + 1920.0 + 384.0);
  c.cofrgenet.glu = true;  // G2 instead of U
  EXPECT_DOUBLE_EQ(ffn_flops(c), 8192.0 + 8192.0 + 1920.0 + 384.0);
  c.cofrgenet.glu = false;
  c.cofrgenet.univariate = true;  // L p weights per depth, V as L p weights: the same count
  EXPECT_DOUBLE_EQ(ffn_flops(c), 8192.0 + 8192.0 + 1920.0 + 384.0);
}

TEST(Flops, EveryKindHasACase) {
  // The cases above; a new kind must add its own.
  const std::set<std::string> mixers{"mha",     "sparse_attention", "synthesizer_dense",
                                     "cattn_m", "cattn_u",          "cem_attention"};
  const std::set<std::string> ffns{"gelu_mlp", "swiglu", "cem_mlp", "cffn"};
  for (const std::string& k : mixer_kind_names()) EXPECT_TRUE(mixers.count(k)) << k;
  for (const std::string& k : ffn_kind_names()) EXPECT_TRUE(ffns.count(k)) << k;
}

TEST(Flops, MhaPlusSwiGluModelIsTheOlderPalmFormula) {
  // For mha + swiglu the per-kind sum plus the head, times 3, equals 6 P_mm + 12 L H d_h S with
  // P_mm every 2-D non-embedding parameter and the head: the convention bench train used before.
  ModelConfig c = flops_base();
  c.n_layers = 2;
  c.n_kv_heads = 2;
  LmModel model(c);
  int64_t p_mm = 0;
  for (const ParamInfo& p : model->parameter_table())
    if (p.shape.size() == 2 && p.kind != ParamKind::kEmbedding) p_mm += p.numel;
  if (c.tie_embeddings) p_mm += c.vocab_size * c.d_model;
  double sum = 2.0 * double(c.vocab_size * c.d_model);
  for (int64_t l = 0; l < c.n_layers; ++l)
    sum += model->block(l).mixer().forward_flops_per_token(kS) +
           model->block(l).ffn().forward_flops_per_token();
  EXPECT_DOUBLE_EQ(3.0 * sum, 6.0 * double(p_mm) + 12.0 * 2 * 4 * 16 * kS);
}

}  // namespace
}  // namespace cemfrac
