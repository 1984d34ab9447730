// Suite files (compare/suite.h): what a valid suite parses to, and every bad suite as one error
// line naming the file's line, for language-model and GP suites; nothing runs before the check.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "cemfrac/compare/plan.h"
#include "cemfrac/compare/suite.h"
#include "cemfrac/core/check.h"
#include "tests/compare/suite_fixtures.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;
using test::gp_suite;
using test::tiny_suite;
using test::write_suite;

// The 1-based line of the first occurrence of `needle` in `text`.
int line_of(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  EXPECT_NE(at, std::string::npos) << needle;
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + at, '\n'));
}

TEST(CompareSuite, ParsesRunsVariantsAndClaims) {
  const std::string dir = test::temp_dir("compare-suite");
  const Suite s = load_suite(write_suite(dir, tiny_suite("data/x")));
  EXPECT_EQ(s.name, "tiny");
  ASSERT_EQ(s.runs.size(), 2u);
  EXPECT_EQ(s.runs[0].lr, (std::vector<double>{1e-3, 1e-2}));
  EXPECT_EQ(s.runs[1].lr, (std::vector<double>{3e-3}));  // the suite's, unused: lr_from
  EXPECT_EQ(s.runs[1].lr_from, "llama");
  EXPECT_EQ(s.runs[0].seeds, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(s.runs[0].tokens, 256);
  EXPECT_EQ(s.runs[1].sets.back(), "model.n_kv_heads=0");  // the run's after the suite's
  ASSERT_EQ(s.runs[1].variants.size(), 2u);
  EXPECT_EQ(s.runs[1].variants[1].name, "T=2");
  EXPECT_EQ(s.runs[1].variants[1].sets, (std::vector<std::string>{"model.cem.steps=2"}));
  ASSERT_EQ(s.claims.size(), 2u);
  EXPECT_EQ(s.claims[1].a, (std::vector<std::string>{"cem@T=2"}));
  EXPECT_EQ(s.claims[1].test, ClaimTest::kNotWorse);
  EXPECT_DOUBLE_EQ(s.claims[1].margin, 0.01);
  EXPECT_EQ(split_row("cem@T=2"), (std::pair<std::string, std::string>{"cem", "T=2"}));
}

TEST(CompareSuite, BadSuitesAreOneLineErrors) {
  const std::string dir = test::temp_dir("compare-bad");
  auto expect_bad = [&](const std::string& text, const std::string& needle) {
    const std::string path = write_suite(dir, text);
    try {
      load_suite(path);
      ADD_FAILURE() << "accepted a suite that should fail with '" << needle << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(needle), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  const std::string good = tiny_suite("data/x");
  expect_bad(good + "\nbogus = 1\n", "unknown key 'bogus'");
  expect_bad(tiny_suite("data/x", "colour = 1"), "unknown key 'colour' in [suite]");
  expect_bad(tiny_suite("data/x", "",
                        "\n[[run]]\nname = \"llama\"\nconfig = \"" +
                            test::source_path("configs/tiny-llama.toml") + "\"\n"),
             "two runs named 'llama'");
  expect_bad(tiny_suite("data/x", "", "\n[[run]]\nname = \"x\"\nconfig = \"no/such.toml\"\n"),
             "config 'no/such.toml' not found");
  expect_bad(tiny_suite("data/x", "",
                        "\n[[claim]]\nid = \"C3\"\ntext = \"t\"\na = \"gpt\"\nb = \"llama\"\n"),
             "'gpt' names no run");
  expect_bad(tiny_suite("data/x", "",
                        "\n[[claim]]\nid = \"C3\"\ntext = \"t\"\na = \"cem@T=9\"\nb = \"cem\"\n"),
             "no test-time variant 'T=9'");
  expect_bad(tiny_suite("data/x", "",
                        "\n[[run]]\nname = \"y\"\nconfig = \"" +
                            test::source_path("configs/tiny-llama.toml") +
                            "\"\nset = [\"model.d_mdl=3\"]\n"),
             "d_mdl");
  expect_bad(
      tiny_suite(
          "data/x", "",
          "\n[[claim]]\nid = \"C3\"\ntext = \"t\"\na = \"cem\"\nb = \"llama\"\ntest = \"maybe\"\n"),
      "test 'maybe'");
  expect_bad("[suite]\nname = \"x\"\n", "no [[run]] tables");
  expect_bad("[suite\n", "TOML syntax");
  std::string no_search = good;
  no_search.replace(no_search.find("lr_search_tokens = 128\n"), 23, "");
  expect_bad(no_search, "needs [suite].lr_search_tokens");
  // Downstream: tasks, [[finetune]] and the claims that name them.
  const std::string ft = "\n[[finetune]]\nname = \"genre\"\ntask = \"brown-genre\"\n";
  expect_bad(tiny_suite("data/x", "tasks = [\"no-such-task\"]"),
             "'no-such-task' is neither a built-in task (brown-cloze, brown-mc, brown-rolling)");
  expect_bad(tiny_suite("data/x", "tasks = [\"brown-mc\", \"brown-mc\"]"),
             "two tasks named 'brown-mc'");
  expect_bad(tiny_suite("data/x", "", ft + "colour = 1\n"), "unknown key 'colour' in [[finetune]]");
  expect_bad(tiny_suite("data/x", "", ft + ft), "two [[finetune]] tables named 'genre'");
  expect_bad(tiny_suite("data/x", "", "\n[[finetune]]\nname = \"g\"\ntask = \"imdb\"\n"),
             "task 'imdb': expected one of cola, sst2");
  expect_bad(tiny_suite("data/x", "", "\n[[finetune]]\nname = \"g\"\ntask = \"mrpc\"\n"),
             "task mrpc needs data = the task's folder");
  expect_bad(tiny_suite("data/x", "", ft + "data = \"x\"\n"), "brown-genre is built in: no data");
  expect_bad(tiny_suite("data/x", "", ft + "epochs = 0\n"), "epochs must be > 0");
  expect_bad(tiny_suite("data/x", "",
                        "\n[[claim]]\nid = \"C3\"\ntext = \"t\"\na = \"cem\"\nb = \"llama\"\n"
                        "metric = \"finetune_error:genre\"\n"),
             "metric 'finetune_error:genre' names no [[finetune]]");
  expect_bad(tiny_suite("data/x", "",
                        "\n[[claim]]\nid = \"C3\"\ntext = \"t\"\na = \"cem\"\nb = \"llama\"\n"
                        "metric = \"task_error:brown-mc\"\n"),
             "metric 'task_error:brown-mc' names no task of [suite].tasks");
  expect_bad(gp_suite("", ft), "[suite].tasks and [[finetune]] apply to LM runs");
  {
    const Suite d = load_suite(write_suite(
        dir, tiny_suite("data/x", "tasks = [\"brown-mc\"]",
                        ft + "seeds = [3, 4]\nlr = 3e-4\nepochs = 0.5\nbatch = 8\nmax_len = 64\n"
                             "\n[[claim]]\nid = \"D\"\ntext = \"t\"\na = \"cem\"\nb = \"llama\"\n"
                             "metric = \"finetune_error:genre\"\n")));
    EXPECT_EQ(d.tasks, (std::vector<std::string>{"brown-mc"}));
    ASSERT_EQ(d.finetunes.size(), 1u);
    EXPECT_EQ(d.finetunes[0].seeds, (std::vector<uint64_t>{3, 4}));
    EXPECT_DOUBLE_EQ(d.finetunes[0].lr, 3e-4);
    EXPECT_DOUBLE_EQ(d.finetunes[0].epochs, 0.5);
    EXPECT_EQ(d.finetunes[0].batch, 8);
    EXPECT_EQ(d.finetunes[0].max_len, 64);
    EXPECT_EQ(d.claims.back().metric, "finetune_error:genre");
  }
  // Through the CLI: one line on stderr, non-zero exit.
  test::expect_one_line_error(
      test::run_cemfrac({"compare", "--suite", write_suite(dir, good + "\nx = 1\n")}),
      "unknown key 'x'");
  test::expect_one_line_error(test::run_cemfrac({"compare", "--suite", dir + "/none.toml"}),
                              "cannot read suite");
}

TEST(CompareSuite, ParsesGpRuns) {
  const std::string dir = test::temp_dir("compare-gp-suite");
  const Suite s = load_suite(write_suite(dir, gp_suite()));
  EXPECT_EQ(s.gp.steps, 3);
  EXPECT_EQ(s.gp.search_steps, 2);
  EXPECT_EQ(s.gp.batch, 2);
  EXPECT_EQ(s.gp.eval_seed, 5u);
  EXPECT_EQ(s.gp.threads, 1);  // the default
  ASSERT_EQ(s.runs.size(), 3u);
  EXPECT_EQ(s.runs[0].task, SuiteTask::kGp);
  EXPECT_EQ(s.runs[0].gp.model, GpModelKind::kCem);
  EXPECT_EQ(s.runs[0].gp.T, 1);
  EXPECT_EQ(s.runs[0].gp.steps, 3);
  ASSERT_EQ(s.runs[0].variants.size(), 2u);
  EXPECT_EQ(s.runs[0].variants[1].name, "T=2");
  EXPECT_EQ(s.runs[0].variants[1].cem_steps, 2);
  EXPECT_EQ(s.runs[1].gp.variant, "fixed");  // the default reading
  EXPECT_EQ(s.runs[1].gp.T, 2);
  EXPECT_EQ(s.runs[2].gp.model, GpModelKind::kLlama);
  EXPECT_EQ(s.runs[2].gp.steps, 2);  // the run's own budget
  EXPECT_EQ(s.runs[2].seeds, (std::vector<uint64_t>{1}));
  EXPECT_TRUE(s.has_task(SuiteTask::kGp));
  EXPECT_FALSE(s.has_task(SuiteTask::kLm));
  ASSERT_EQ(s.claims.size(), 2u);
  EXPECT_EQ(s.claims[0].metric, "test_rmse");  // the default for GP rows
  EXPECT_EQ(s.claims[1].metric, "test_rmse");
  EXPECT_EQ(s.runs[0].gp.layers, 1);  // [gp].layers
  EXPECT_EQ(s.runs[0].gp.ffn, "");    // each model's own FFN
  // No --ffn unless asked: earlier suites' job settings (compare-run.json) are unchanged.
  const std::vector<std::string> args =
      make_gp(s, s.runs[0], "x", dir + "/x", 3, 1e-3, 1, 4, true).args;
  EXPECT_EQ(std::count(args.begin(), args.end(), "--ffn"), 0);

  // Attention-only models and a per-run depth.
  const Suite a = load_suite(
      write_suite(dir, gp_suite("ffn = \"none\"\n",
                                "\n[[run]]\nname = \"deep\"\ntask = \"gp\"\nT = 4\nlayers = 2\n")));
  EXPECT_EQ(a.gp.ffn, "none");
  ASSERT_EQ(a.runs.size(), 4u);
  EXPECT_EQ(a.runs[0].gp.ffn, "none");
  EXPECT_EQ(a.runs[0].gp.layers, 1);
  EXPECT_EQ(a.runs[3].gp.layers, 2);
  const std::vector<std::string> deep =
      make_gp(a, a.runs[3], "deep", dir + "/deep", 3, 1e-3, 1, 4, true).args;
  const auto at = [&](const std::string& flag) {
    const auto it = std::find(deep.begin(), deep.end(), flag);
    return it == deep.end() || it + 1 == deep.end() ? std::string("(absent)") : *(it + 1);
  };
  EXPECT_EQ(at("--layers"), "2");
  EXPECT_EQ(at("--ffn"), "none");
  EXPECT_EQ(at("--steps"), "4");
}

TEST(CompareSuite, BadGpSuitesAreOneLineErrorsWithTheLine) {
  const std::string dir = test::temp_dir("compare-gp-bad");
  auto expect_bad = [&](const std::string& text, const std::string& needle) {
    const std::string path = write_suite(dir, text);
    try {
      load_suite(path);
      ADD_FAILURE() << "accepted a suite that should fail with '" << needle << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(needle), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  const int extra = line_of(gp_suite("depth = 3\n"), "depth");  // where extra_gp lands
  expect_bad(gp_suite("depth = 3\n"),
             fmt::format("suite.toml:{}: unknown key 'depth' in [gp]", extra));
  expect_bad(gp_suite("threads = 0\n"),
             fmt::format("suite.toml:{}: [gp].threads: expected an integer >= 1", extra));
  expect_bad(gp_suite("positions = \"rope\"\nthreads = 2000\n"),
             fmt::format("suite.toml:{}: [gp].threads: at most 1024", extra + 1));
  expect_bad(gp_suite("positions = \"learned\"\n"), "[gp].positions 'learned'");
  expect_bad(gp_suite("ffn = \"swiglu\"\n"), "[gp].ffn 'swiglu': expected none");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"gp\"\nffn = \"gelu\"\n"),
             "run 'x'.ffn 'gelu': expected none");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"gp\"\nlayers = 65\n"),
             "run 'x'.layers: at most 64");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"gp\"\nconfig = \"a.toml\"\n"),
             "key 'config' is for task = \"lm\" runs");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"gp\"\nT = 65\n"), ".T = 65");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"gp\"\nT = 0\n"),
             "T: expected an integer >= 1");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"lmm\"\n"), "task 'lmm'");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"gp\"\nmodel = \"gpt\"\n"),
             "model 'gpt'");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"gp\"\nmodel = \"llama\"\nT = 2\n"),
             "key 'T' is for CEM models");
  expect_bad(gp_suite("",
                      "\n[[claim]]\nid = \"G3\"\ntext = \"t\"\na = \"fixed-t2\"\nb = "
                      "\"fixed-t1\"\nmetric = \"test_loss\"\n"),
             "metric 'test_loss' for GP runs");
  expect_bad(gp_suite("",
                      "\n[[claim]]\nid = \"G3\"\ntext = \"t\"\na = \"fixed-t1@T=2\"\nb = "
                      "\"fixed-t1\"\nmetric = \"val_rmse\"\n"),
             "a test-time variant has only test_rmse");
  expect_bad(gp_suite("",
                      "\n[[claim]]\nid = \"G3\"\ntext = \"t\"\na = \"fixed-t2@T=4\"\nb = "
                      "\"fixed-t1\"\n"),
             "no test-time variant 'T=4'");
  std::string no_search = gp_suite();
  no_search.replace(no_search.find("search_steps = 2\n"), 17, "");
  expect_bad(no_search, "needs [gp].search_steps");
  std::string no_steps = gp_suite();
  no_steps.replace(no_steps.find("steps = 3\n"), 10, "");
  expect_bad(no_steps, "run 'fixed-t1': no step budget");
  // An LM key in a GP run and a GP key in an LM run, each with its line.
  const std::string lm =
      tiny_suite("data/x", "",
                 "\n[[run]]\nname = \"y\"\nconfig = \"" +
                     test::source_path("configs/tiny-llama.toml") + "\"\nvariant = \"iterate\"\n");
  const std::string lm_path = write_suite(dir, lm);
  try {
    load_suite(lm_path);
    ADD_FAILURE() << "accepted a GP key in an LM run";
  } catch (const Error& e) {
    const std::string what = e.what();
    const int line = line_of(lm, "variant = \"iterate\"");
    EXPECT_NE(
        what.find(fmt::format("suite.toml:{}: run 'y': key 'variant' is for task = \"gp\"", line)),
        std::string::npos)
        << what;
  }
  // A claim across tasks: a GP run against an LM run.
  const std::string mixed =
      tiny_suite("data/x", "",
                 "\n[[run]]\nname = \"g\"\ntask = \"gp\"\nsteps = 3\n\n[[claim]]\nid = \"M\"\n"
                 "text = \"t\"\na = \"g\"\nb = \"llama\"\n");
  expect_bad(mixed, "a claim compares runs of one task");
  // An unknown reading of the recursion is refused by compare (the variant names live in the GP
  // task), with the variant's line, before anything trains.
  const std::string bad_variant = gp_suite("",
                                           "\n[[run]]\nname = \"x\"\ntask = \"gp\"\n"
                                           "variant = \"iterate+proxx\"\nT = 2\n");
  const int vline = line_of(bad_variant, "variant = \"iterate+proxx\"");
  const std::string out = dir + "/out-bad-variant";
  test::expect_one_line_error(
      test::run_cemfrac({"compare", "--suite", write_suite(dir, bad_variant), "--out", out}),
      fmt::format("suite.toml:{}: run 'x': GP variant \"iterate+proxx\": unknown part \"proxx\"",
                  vline));
  EXPECT_FALSE(fs::exists(out + "/plan")) << "nothing may run before the suite is checked";
}

}  // namespace
}  // namespace cemfrac
