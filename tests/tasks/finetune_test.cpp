// Fine-tuning (tasks/finetune.h, tasks/glue.h): GLUE's own file layouts written here column for
// column, the pooled features' twin against the model's forward on every model kind, training
// through the Trainer with exact resume, and the fine-tuned checkpoint loading as a model.
#include "cemfrac/tasks/finetune.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/types.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/ops/linear.h"
#include "cemfrac/tasks/glue.h"
#include "cemfrac/train/model_loader.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// GLUE's files, header lines exactly as GLUE's download script leaves them.
void write_glue(const std::string& dir) {
  namespace fs = std::filesystem;
  auto put = [&](const std::string& task, const std::string& file, const std::string& text) {
    fs::create_directories(dir + "/" + task);
    test::write_file(dir + "/" + task + "/" + file, text);
  };
  const std::string cola =
      "gj04\t1\t\tOur friends won't buy this analysis, let alone the next one we propose.\n"
      "gj04\t0\t*\tThey drank the pub.\n";
  put("CoLA", "train.tsv", cola);
  put("CoLA", "dev.tsv", cola);
  const std::string sst = "sentence\tlabel\nhide new secretions from the parental units \t0\n"
                          "the greatest musicians \t1\n";
  put("SST-2", "train.tsv", sst);
  put("SST-2", "dev.tsv", sst);
  const std::string mrpc =
      "\xEF\xBB\xBFQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
      "1\t702876\t702977\tAmrozi accused his brother.\tReferring to him, Amrozi accused.\n"
      "0\t2108705\t2108831\tYucaipa owned Dominick 's.\tYucaipa bought Dominick 's in 1995.\n";
  put("MRPC", "train.tsv", mrpc);
  put("MRPC", "dev.tsv", mrpc);
  const std::string qqp = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
                          "133273\t213221\t213222\tHow is the life?\tWhat is life like?\t0\n"
                          "402555\t536040\t536041\tHow do I learn?\tHow can I learn?\t1\n";
  put("QQP", "train.tsv", qqp);
  put("QQP", "dev.tsv", qqp);
  const std::string stsb =
      "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
      "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\tAn air "
      "plane is taking off.\t5.000\n"
      "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man is playing a flute.\tA man "
      "is playing a flute badly.\t3.800\n"
      "2\tmain-captions\tMSRvid\t2012test\t0005\tnone\tnone\tA man slices.\tA cat sleeps.\t0.200\n";
  put("STS-B", "train.tsv", stsb);
  put("STS-B", "dev.tsv", stsb);
  const std::string mnli_head =
      "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
      "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\t";
  const std::string mnli_row = "0\t31193\t31193n\tgovernment\t( ( x ) )\t( ( y ) )\t(ROOT x)\t"
                               "(ROOT y)\tConceptually cream skimming.\tProduct and geography.\t";
  put("MNLI", "train.tsv",
      mnli_head + "label1\tgold_label\n" + mnli_row + "neutral\tneutral\n" + mnli_row +
          "entailment\tentailment\n");
  const std::string mnli_dev = mnli_head + "label1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n" +
                               mnli_row + "neutral\tneutral\tneutral\tneutral\tneutral\tneutral\n" +
                               mnli_row + "contradiction\tneutral\tcontradiction\tcontradiction\t" +
                               "contradiction\tcontradiction\n";
  put("MNLI", "dev_matched.tsv", mnli_dev);
  put("MNLI", "dev_mismatched.tsv", mnli_dev);
  const std::string qnli = "index\tquestion\tsentence\tlabel\n"
                           "0\tWhen did it start?\tIt started in 1990.\tentailment\n"
                           "1\tWho is he?\tThe sky is blue.\tnot_entailment\n";
  put("QNLI", "train.tsv", qnli);
  put("QNLI", "dev.tsv", qnli);
  const std::string rte = "index\tsentence1\tsentence2\tlabel\n"
                          "0\tNo weapons were found.\tWeapons were found.\tnot_entailment\n"
                          "1\tA place of sorrow.\tA sad place.\tentailment\n";
  put("RTE", "train.tsv", rte);
  put("RTE", "dev.tsv", rte);
  const std::string wnli = "index\tsentence1\tsentence2\tlabel\n"
                           "0\tI stuck a pin through a carrot.\tThe carrot had a hole.\t1\n"
                           "1\tJohn could not see the stage.\tJohn is short.\t0\n";
  put("WNLI", "train.tsv", wnli);
  put("WNLI", "dev.tsv", wnli);
}

TEST(Glue, ReadsEveryTaskInGluesOwnLayout) {
  const std::string dir = test::temp_dir("glue_layouts");
  write_glue(dir);
  const std::vector<std::pair<std::string, std::string>> tasks = {
      {"cola", "CoLA"}, {"sst2", "SST-2"}, {"mrpc", "MRPC"}, {"qqp", "QQP"}, {"stsb", "STS-B"},
      {"mnli", "MNLI"}, {"qnli", "QNLI"},  {"rte", "RTE"},   {"wnli", "WNLI"}};
  for (const auto& [name, folder] : tasks) {
    SCOPED_TRACE(name);
    const ClassificationTask t = read_finetune_task(name, dir + "/" + folder);
    EXPECT_GE(t.train.examples.size(), 2u);
    EXPECT_FALSE(t.evals.empty());
    for (const auto& ex : t.train.examples) EXPECT_FALSE(ex.text_a.empty());
  }
  const auto cola = read_finetune_task("cola", dir + "/CoLA");
  EXPECT_EQ(cola.train.examples[1].text_a, "They drank the pub.");
  EXPECT_EQ(cola.train.examples[0].label, 1);
  EXPECT_FALSE(cola.pairs);
  const auto mrpc = read_finetune_task("mrpc", dir + "/MRPC");  // the BOM before "Quality"
  EXPECT_EQ(mrpc.train.examples[0].text_b, "Referring to him, Amrozi accused.");
  EXPECT_EQ(mrpc.train.examples[1].label, 0);
  const auto stsb = read_finetune_task("stsb", dir + "/STS-B");
  EXPECT_TRUE(stsb.regression);
  EXPECT_DOUBLE_EQ(stsb.train.examples[1].score, 3.8);
  const auto mnli = read_finetune_task("mnli", dir + "/MNLI");
  ASSERT_EQ(mnli.evals.size(), 2u);
  EXPECT_EQ(mnli.evals[0].name, "dev_matched");
  EXPECT_EQ(mnli.evals[1].name, "dev_mismatched");
  EXPECT_EQ(mnli.labels[mnli.evals[0].examples[1].label], "contradiction");  // gold, not label1
  const auto qqp = read_finetune_task("qqp", dir + "/QQP");
  EXPECT_EQ(qqp.train.examples[1].text_a, "How do I learn?");
  EXPECT_EQ(qqp.train.examples[1].label, 1);
}

TEST(Glue, BadLinesAreOneErrorNamingFileAndLine) {
  const std::string dir = test::temp_dir("glue_bad");
  test::write_file(dir + "/rte.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n"
                                     "1\ta\tb\tmaybe\n");
  EXPECT_NE(error_of([&] { read_glue_file("rte", dir + "/rte.tsv"); })
                .find("rte.tsv:3: label 'maybe' is not one of entailment, not_entailment"),
            std::string::npos);
  test::write_file(dir + "/short.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\n");
  EXPECT_NE(error_of([&] { read_glue_file("rte", dir + "/short.tsv"); }).find("short.tsv:2: 3 "),
            std::string::npos);
  test::write_file(dir + "/sts.tsv",
                   "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
                   "sentence2\tscore\n0\tg\tf\ty\to\ts\ts\ta\tb\tfive\n");
  EXPECT_NE(error_of([&] { read_glue_file("stsb", dir + "/sts.tsv"); })
                .find("sts.tsv:2: score 'five' is not a number"),
            std::string::npos);
  test::write_file(dir + "/hdr.tsv", "sentence\tlabels\nx\t1\n");
  EXPECT_NE(error_of([&] { read_glue_file("sst2", dir + "/hdr.tsv"); })
                .find("hdr.tsv:1: the header has no column 'label'"),
            std::string::npos);
  std::filesystem::create_directories(dir + "/plain");
  test::write_file(dir + "/plain/train.tsv", "good\tpos\nbad\tneg\n");
  test::write_file(dir + "/plain/dev.tsv", "fine\tpos\nmeh\tneutral\n");
  EXPECT_NE(error_of([&] { read_finetune_task("tsv", dir + "/plain"); })
                .find("dev.tsv:2: label 'neutral' does not occur in train.tsv"),
            std::string::npos);
}

TEST(Glue, MetricsAreTheTasksOwn) {
  ClassificationTask mrpc;
  mrpc.name = "mrpc";
  LabelledSet set;
  for (int64_t g : {1, 1, 0, 0}) set.examples.push_back({"a", "b", g, 0});
  // Predictions 1 0 1 0: tp 1, fn 1, fp 1, tn 1: acc 1/2, F1 2/4.
  auto m = task_metrics(mrpc, set, {1, 0, 1, 0}, {});
  EXPECT_DOUBLE_EQ(m["acc"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(m["f1"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(m["majority"].get<double>(), 0.5);
  ClassificationTask cola = mrpc;
  cola.name = "cola";
  EXPECT_DOUBLE_EQ(task_metrics(cola, set, {1, 1, 0, 0}, {})["mcc"].get<double>(), 1.0);
  ClassificationTask sts;
  sts.name = "stsb";
  sts.regression = true;
  LabelledSet s2;
  for (double g : {1.0, 2.0, 3.0}) s2.examples.push_back({"a", "b", 0, g});
  auto r = task_metrics(sts, s2, {}, {0.1, 0.3, 0.2});
  EXPECT_NEAR(r["pearson"].get<double>(), 0.5, 1e-12);
  EXPECT_NEAR(r["spearman"].get<double>(), 0.5, 1e-12);
}

struct Kind {
  const char* name;
  std::string mixer, ffn;
  bool gpt2;
};
const std::vector<Kind> kKinds = {{"gpt2", "mha", "gelu_mlp", true},
                                  {"llama", "mha", "swiglu", false},
                                  {"cofrgenet_f", "mha", "cffn", true},
                                  {"cofrgenet", "cattn_m", "cffn", true},
                                  {"cem_both", "cem_attention", "cem_mlp", false}};

ModelConfig kind_config(const Kind& k) {
  ModelConfig c = test::tiny_model(257, 24, 48);
  if (k.gpt2) c = test::gpt2_flavour(c);
  c.mixer = k.mixer;
  c.ffn = k.ffn;
  return c;
}

// Labels: blanks around a label are not part of it ("pos " is "pos"), and a classification
// training set of one class is refused for every task, GLUE's included (SST-2 all 0).
TEST(Glue, LabelsAreTrimmedAndOneClassTrainingSetsAreRefused) {
  const std::string root = test::temp_dir("finetune_labels");
  std::filesystem::create_directories(root + "/tsv");
  test::write_file(root + "/tsv/train.tsv", "a good film\tpos \na bad film\tneg\nfine\t pos\n");
  test::write_file(root + "/tsv/dev.tsv", "great\tpos\nawful\tneg\r\n");
  const ClassificationTask t = read_finetune_task("tsv", root + "/tsv");
  EXPECT_EQ(t.labels, (std::vector<std::string>{"neg", "pos"}));
  EXPECT_EQ(t.train.examples[0].label, t.train.examples[2].label);
  std::filesystem::create_directories(root + "/SST-2");
  const std::string all_zero = "sentence\tlabel\nhide new secretions \t0\nthe greatest \t0\n";
  test::write_file(root + "/SST-2/train.tsv", all_zero);
  test::write_file(root + "/SST-2/dev.tsv", all_zero);
  const std::string e = error_of([&] { read_finetune_task("sst2", root + "/SST-2"); });
  EXPECT_NE(e.find("SST-2/train.tsv: every example has the label '0'; classification needs two"),
            std::string::npos)
      << e;
}

TEST(Finetune, FeaturesTimesHeadAreTheForwardLogitsOnEveryModelKind) {
  for (const Kind& k : kKinds) {
    SCOPED_TRACE(k.name);
    torch::manual_seed(3);
    LmModel model(kind_config(k));
    model->eval();
    const torch::Tensor x = torch::randint(0, 257, {2, 9}, torch::kInt64);
    torch::NoGradGuard g;
    const torch::Tensor logits = model->forward(x);
    const torch::Tensor twin = cemfrac::linear(lm_features(model, x), model->head_weight());
    EXPECT_LT(test::rel_err(twin, logits), 1e-6);
  }
}

// The head reads the last real token's feature. On a model: a padded row pools exactly the feature
// the unpadded sequence has at its last position (a causal model; pooling one position early or at
// the padded end gives another vector, which the second half checks the test can see).
TEST(Finetune, PoolingTakesTheLastNonPaddingTokenOfEveryRow) {
  const TokenId pad = 0;
  // Features that name their own position: feature[b, s, :] = 10 b + s.
  const torch::Tensor pos = torch::arange(6, torch::kFloat32).view({1, 6, 1});
  const torch::Tensor feats =
      (pos + 10 * torch::arange(3, torch::kFloat32).view({3, 1, 1})).expand({3, 6, 2}).contiguous();
  const torch::Tensor tokens = torch::tensor({0, 5, 6, 0, 7, 0,   // pair: last real token at 4
                                              0, 5, 0, 0, 0, 0,   // short: 1
                                              0, 5, 6, 7, 8, 9},  // full: 5
                                             torch::kInt64)
                                   .view({3, 6});
  const torch::Tensor pooled = pool_last_token(feats, tokens, pad);
  EXPECT_TRUE(torch::equal(pooled.select(1, 0), torch::tensor({4.0f, 11.0f, 25.0f}))) << pooled;

  for (const Kind& k : kKinds) {
    SCOPED_TRACE(k.name);
    torch::manual_seed(5);
    LmModel model(kind_config(k));
    model->eval();
    torch::NoGradGuard g;
    const std::vector<int64_t> row = {256, 40, 41, 42, 256, 43, 44};  // eot a a a eot b b
    torch::Tensor padded = torch::full({1, 11}, 256, torch::kInt64);
    padded.narrow(1, 0, 7).copy_(torch::tensor(row).view({1, 7}));
    const torch::Tensor alone = lm_features(model, torch::tensor(row).view({1, 7}));
    const torch::Tensor got = pool_last_token(lm_features(model, padded), padded, 256);
    EXPECT_LT(test::rel_err(got, alone.select(1, 6)), 1e-5);
    EXPECT_GT(test::rel_err(got, alone.select(1, 5)), 1e-3);  // one position early differs
    EXPECT_GT(test::rel_err(got, lm_features(model, padded).select(1, 10)), 1e-3);  // padded end
  }
}

// predict() gives one prediction per example, in order, whatever the batch size: a forward whose
// argmax is each row's second token (the first is the end-of-text id) must come back unchanged for
// 7 examples in batches of 1, 3 and 7, and regression scores likewise.
TEST(Finetune, PredictKeepsEveryExampleInOrder) {
  std::vector<EncodedExample> examples;
  for (int64_t i = 0; i < 7; ++i) examples.push_back({{256, (i * 5) % 7, 3}, (i * 5) % 7, 0.0});
  const auto tok = make_tokenizer("byte");
  FinetuneData sized("test", false, examples, examples, tok.get());
  DataLayout layout;
  layout.seq_len = 4;
  layout.micro_batch = 1;
  sized.open(layout);
  auto forward = [](const torch::Tensor& batch) {
    return torch::one_hot(batch.select(1, 1), 7).to(torch::kFloat32);  // (B, 7)
  };
  for (int64_t b : {1, 3, 7}) {
    std::vector<int64_t> classes;
    std::vector<double> scores;
    predict(forward, sized, examples, b, false, &classes, &scores);
    ASSERT_EQ(classes.size(), examples.size()) << b;
    for (size_t i = 0; i < examples.size(); ++i) EXPECT_EQ(classes[i], examples[i].label) << b;
    classes.clear();
    predict(
        [](const torch::Tensor& x) {
          return x.select(1, 1).to(torch::kFloat32).view({-1, 1});
        },
        sized, examples, b, true, &classes, &scores);
    ASSERT_EQ(scores.size(), examples.size()) << b;
    for (size_t i = 0; i < examples.size(); ++i)
      EXPECT_EQ(scores[i], static_cast<double>(examples[i].label)) << b;
  }
}

void write_mrpc_like(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::string rows = "\xEF\xBB\xBFQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n";
  const char* words[] = {"red", "blue", "green", "cold", "warm", "soft"};
  for (int i = 0; i < 12; ++i) {
    const std::string a = std::string("the ") + words[i % 6] + " sky", b =
        i % 2 ? std::string("a ") + words[i % 6] + " sea" : std::string("no ") + words[(i + 1) % 6];
    rows += fmt::format("{}\t{}\t{}\t{}\t{}\n", i % 2, 100 + i, 200 + i, a, b);
  }
  test::write_file(dir + "/train.tsv", rows);
  test::write_file(dir + "/dev.tsv", rows);
}

std::vector<std::string> metric_lines(const std::string& run) {
  std::vector<std::string> lines;
  const std::string text = test::read_file(run + "/metrics.jsonl");
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    auto j = nlohmann::json::parse(text.substr(start, end - start));
    j.erase("tokens_per_s");
    j.erase("elapsed_s");
    lines.push_back(j.dump());
    start = end + 1;
  }
  return lines;
}

// The task readers check their files as every reader does (core/input_file.h): a directory or a
// FIFO where train.tsv should be is named as such (a FIFO is never opened: that would block).
TEST(Glue, ADirectoryOrAFifoIsNamedAsSuch) {
  const std::string root = test::temp_dir("finetune_inputs");
  std::filesystem::create_directories(root + "/dir/train.tsv");
  std::string e = error_of([&] { read_finetune_task("tsv", root + "/dir"); });
  EXPECT_NE(e.find("train.tsv: is a directory, not a file"), std::string::npos) << e;
  std::filesystem::create_directories(root + "/fifo");
  ASSERT_EQ(mkfifo((root + "/fifo/train.tsv").c_str(), 0600), 0);
  e = error_of([&] { read_finetune_task("sst2", root + "/fifo"); });
  EXPECT_NE(e.find("train.tsv: is a FIFO (named pipe), not a regular file"), std::string::npos)
      << e;
  e = error_of([&] { read_finetune_task("tsv", root + "/none"); });
  EXPECT_NE(e.find("none/train.tsv: no such file"), std::string::npos) << e;
}

// Every finetune flag is checked on its own, before anything is loaded: one line naming it.
TEST(Finetune, FlagsAreCheckedOneByOne) {
  const std::string root = test::temp_dir("finetune_flags");
  write_mrpc_like(root + "/MRPC");
  torch::manual_seed(9);
  LmModel pre(kind_config(kKinds[0]));
  FinetuneOptions o;
  o.checkpoint = test::save_byte_checkpoint(pre, "finetune_flags_pre");
  o.task = "mrpc";
  o.data_dir = root + "/MRPC";
  o.out = root + "/run";
  o.progress = false;
  auto with = [&](auto edit) {
    FinetuneOptions x = o;
    edit(x);
    return error_of([&] { run_finetune(x); });
  };
  EXPECT_NE(with([](FinetuneOptions& x) {
              x.max_len = -5;
            }).find("--max-len -5: must be 0 (the model's context) or 3 or more"),
            std::string::npos);
  EXPECT_NE(with([](FinetuneOptions& x) { x.stop_at_step = -1; }).find("--stop-at-step -1"),
            std::string::npos);
  EXPECT_NE(with([](FinetuneOptions& x) {
              x.weight_decay = std::nan("");
            }).find("--weight-decay nan: must be a finite number >= 0"),
            std::string::npos);
  EXPECT_NE(with([&](FinetuneOptions& x) {
              x.resume = root;
            }).find("--checkpoint and --resume exclude each other"),
            std::string::npos);
  EXPECT_NE(with([&](FinetuneOptions& x) {
              x.checkpoint = "";
              x.resume = root + "/nonexist";
            }).find("--resume " + root + "/nonexist: no such directory"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(o.out)) << "a refused run writes nothing";
  // Seeds are unsigned: "-1" is refused as typed, never read as 2^64 - 1.
  test::expect_one_line_error(test::run_cemfrac({"finetune", "--checkpoint", o.checkpoint, "--task",
                                                 "mrpc", "--data", o.data_dir, "--seed", "-1"}),
                              "must be a non-negative integer (got -1)");
  test::expect_one_line_error(test::run_cemfrac({"generate", "--checkpoint", o.checkpoint,
                                                 "--prompt", "a", "--seed", "-1"}),
                              "must be a non-negative integer (got -1)");
}

TEST(Finetune, TrainsThroughTheTrainerResumesExactlyAndLoadsAsAModel) {
  const std::string root = test::temp_dir("finetune_mrpc");
  write_mrpc_like(root + "/MRPC");
  torch::manual_seed(5);
  LmModel pre(kind_config(kKinds[0]));
  const std::string ckpt = test::save_byte_checkpoint(pre, "finetune_pre");

  FinetuneOptions o;
  o.checkpoint = ckpt;
  o.task = "mrpc";
  o.data_dir = root + "/MRPC";
  o.out = root + "/full";
  o.epochs = 2;  // 12 examples, batch 4: 6 steps, an epoch boundary inside
  o.batch = 4;
  o.max_len = 24;
  o.lr = 1e-3;
  o.progress = false;
  const FinetuneResult full = run_finetune(o);
  EXPECT_EQ(full.status, "completed");
  EXPECT_EQ(full.steps, 6);
  const auto report = nlohmann::json::parse(test::read_file(o.out + "/finetune.json"));
  EXPECT_TRUE(report["evals"]["dev"].contains("f1"));
  EXPECT_TRUE(report["evals"]["dev"].contains("acc"));
  EXPECT_EQ(report["evals"]["dev"]["examples"].get<int64_t>(), 12);

  FinetuneOptions part = o;
  part.out = root + "/part";
  part.stop_at_step = 3;
  EXPECT_EQ(run_finetune(part).status, "stopped");
  FinetuneOptions resumed = o;
  resumed.checkpoint = "";
  resumed.out = "";
  resumed.resume = root + "/part";
  EXPECT_EQ(run_finetune(resumed).status, "completed");
  EXPECT_EQ(metric_lines(root + "/part"), metric_lines(root + "/full"));

  // The fine-tuned checkpoint loads as the backbone, its head set aside.
  LoadedModel loaded = load_model(full.checkpoint);
  ASSERT_EQ(loaded.head.count("cls.weight"), 1u);
  EXPECT_EQ(loaded.head.at("cls.weight").sizes(), (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(loaded.head.count("cls.bias"), 1u);
  ASSERT_NE(loaded.tokenizer, nullptr);
  EXPECT_EQ(loaded.tokenizer->id(), "byte");
  // The backbone changed: fine-tuning trained it, not only the head.
  LoadedModel before = load_model(ckpt);
  EXPECT_TRUE(before.head.empty());
  EXPECT_FALSE(torch::equal(before.model->wte().weight, loaded.model->wte().weight));
}

TEST(Finetune, RegressionOnStsbLayoutReportsPearsonAndSpearman) {
  const std::string root = test::temp_dir("finetune_stsb");
  write_glue(root);
  torch::manual_seed(6);
  LmModel pre(kind_config(kKinds[4]));  // CEM both: a model kind with no plain attention
  FinetuneOptions o;
  o.checkpoint = test::save_byte_checkpoint(pre, "finetune_stsb_pre");
  o.task = "stsb";
  o.data_dir = root + "/STS-B";
  o.out = root + "/run";
  o.epochs = 1;
  o.batch = 2;
  o.max_len = 48;
  o.progress = false;
  const FinetuneResult r = run_finetune(o);
  EXPECT_EQ(r.status, "completed");
  EXPECT_TRUE(r.report["evals"]["dev"].contains("pearson"));
  EXPECT_TRUE(r.report["evals"]["dev"].contains("spearman"));
  EXPECT_FALSE(r.report["evals"]["dev"].contains("acc"));
}

TEST(Finetune, CliHelpAndFineTunedCheckpointInEval) {
  const auto help = test::run_cemfrac({"finetune", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--task"), std::string::npos);
  EXPECT_NE(help.out.find("brown-genre"), std::string::npos);

  const std::string root = test::temp_dir("finetune_cli");
  write_mrpc_like(root + "/MRPC");
  torch::manual_seed(7);
  LmModel pre(kind_config(kKinds[1]));
  const std::string ckpt = test::save_byte_checkpoint(pre, "finetune_cli_pre");
  const auto ft = test::run_cemfrac({"finetune", "--checkpoint", ckpt, "--task", "mrpc", "--data",
                                     root + "/MRPC", "--out", root + "/run", "--epochs", "0.5",
                                     "--batch", "4", "--max-len", "24", "--quiet", "--json"});
  ASSERT_EQ(ft.exit_code, 0) << ft.err;
  const auto j = nlohmann::json::parse(ft.out);
  EXPECT_EQ(j["steps"].get<int64_t>(), 2);
  test::write_file(root + "/t.txt", "the red sky and a blue sea");
  const auto ev = test::run_cemfrac({"eval", "--checkpoint", root + "/run", "--text",
                                     root + "/t.txt", "--json"});
  ASSERT_EQ(ev.exit_code, 0) << ev.err;
  EXPECT_GT(nlohmann::json::parse(ev.out)["perplexity"].get<double>(), 1.0);

  const auto bad = test::run_cemfrac({"finetune", "--checkpoint", ckpt, "--task", "mrpc"});
  test::expect_one_line_error(bad, "--task mrpc needs --data DIR");

  // A new fine-tuning run goes only into a new or empty folder, as `train` does (one rule,
  // train/run_dir.h): a folder with a user's files is refused in one line and left as it was.
  const std::string mine = root + "/mine";
  std::filesystem::create_directories(mine);
  test::write_file(mine + "/summary.json", "{\"mine\": true}\n");
  test::write_file(mine + "/metrics.jsonl", "mine\n");
  test::write_file(mine + "/notes.txt", "my notes\n");
  test::expect_one_line_error(
      test::run_cemfrac({"finetune", "--checkpoint", ckpt, "--task", "mrpc", "--data",
                         root + "/MRPC", "--out", mine, "--epochs", "0.5", "--batch", "4",
                         "--max-len", "24", "--quiet"}),
      "--out = " + mine + " is not empty (it holds metrics.jsonl, notes.txt, summary.json)");
  EXPECT_EQ(test::read_file(mine + "/summary.json"), "{\"mine\": true}\n");
  EXPECT_EQ(test::read_file(mine + "/metrics.jsonl"), "mine\n");
  EXPECT_FALSE(std::filesystem::exists(mine + "/finetune.json"));
  EXPECT_FALSE(std::filesystem::exists(mine + "/checkpoints"));
  // A finished fine-tuning run's folder is pointed at --resume.
  test::expect_one_line_error(
      test::run_cemfrac({"finetune", "--checkpoint", ckpt, "--task", "mrpc", "--data",
                         root + "/MRPC", "--out", root + "/run", "--quiet"}),
      "already holds checkpoints; pass --resume");

  // --device is honoured or refused, never ignored: meta (nothing to read losses from) is one line
  // and leaves no run folder; cpu named explicitly trains there and says so.
  test::expect_one_line_error(
      test::run_cemfrac({"--device", "meta", "finetune", "--checkpoint", ckpt, "--task", "mrpc",
                         "--data", root + "/MRPC", "--out", root + "/meta-run", "--quiet"}),
      "finetune on the meta device");
  EXPECT_FALSE(std::filesystem::exists(root + "/meta-run"));
  const auto cpu =
      test::run_cemfrac({"--device", "cpu", "finetune", "--checkpoint", ckpt, "--task", "mrpc",
                         "--data", root + "/MRPC", "--out", root + "/cpu-run", "--epochs", "0.5",
                         "--batch", "4", "--max-len", "24", "--quiet", "--json"});
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  const std::string saved = nlohmann::json::parse(cpu.out)["checkpoint"].get<std::string>();
  const auto trainer = nlohmann::json::parse(test::read_file(saved + "/trainer.json"));
  EXPECT_EQ(trainer["run"]["train.device"], "cpu") << trainer.dump();
}

}  // namespace
}  // namespace cemfrac
