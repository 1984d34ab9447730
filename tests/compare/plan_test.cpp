// The suite's planning, called directly: a training's budget overrides, the reuse / resume /
// refusal of its folder, the timings of another machine, and the learning rate chosen from a grid
// (at the grid's edges, with diverged values, unfinished and all-diverged grids; LM and GP runs).
#include "cemfrac/compare/plan.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cemfrac/compare/run_files.h"
#include "cemfrac/core/check.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Writes `content` to `path`, creating its folders (as a child process would find them).
void put(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  test::write_file(path, content);
}

// Two LM runs: "llama" with a learning-rate grid, "cem" taking llama's rate; one GP run with a
// grid. Steps of 2 x 32 tokens.
std::string plan_suite(const std::string& data) {
  const std::string llama = test::source_path("configs/tiny-llama.toml");
  return "[suite]\nname = \"p\"\ndata = \"" + data +
         "\"\ntokens = 200\nseeds = [5, 6]\nlr = [3e-3]\nlr_search_tokens = 128\nval_points = 2\n"
         "set = [\"model.d_model=32\", \"model.n_layers=1\", \"model.n_heads=2\", "
         "\"model.n_kv_heads=2\", \"model.d_ff=64\", \"model.context=32\", "
         "\"train.micro_batch=2\", \"train.eval_tokens=64\"]\n\n[gp]\nsteps = 10\nsearch_steps = "
         "4\n"
         "\n[[run]]\nname = \"llama\"\nconfig = \"" +
         llama + "\"\nlr = [1e-3, 3e-3, 1e-2]\n\n[[run]]\nname = \"cem\"\nconfig = \"" + llama +
         "\"\nlr_from = \"llama\"\n\n[[run]]\nname = \"g\"\ntask = \"gp\"\nT = 2\n"
         "lr = [1e-3, 1e-2]\n";
}

Suite load(const std::string& dir) {
  put(dir + "/suite.toml", plan_suite(dir + "/data"));
  return load_suite(dir + "/suite.toml");
}

std::vector<std::string> after(const std::vector<std::string>& v, size_t n) {
  return {v.begin() + static_cast<std::ptrdiff_t>(n), v.end()};
}

TEST(ComparePlan, TrainingBudgetInWholeSteps) {
  const std::string dir = test::temp_dir("plan-budget");
  const Suite s = load(dir);
  const SuiteRun& run = s.runs[0];
  ASSERT_EQ(tokens_per_step(load_run_config(run.config, run.sets)), 64);  // 2 x 32
  // 200 tokens: 4 steps of 64 (rounded up), warm-up 10% (at least 1), lr_min = 0.1 lr_max,
  // validation every steps / val_points, the suite's dataset in place of the config's.
  const TrainSpec t = make_train(run, s.data, "x", dir + "/run", 200, 2e-3, 0.1, 7, 2);
  EXPECT_EQ(t.steps, 4);
  EXPECT_EQ(t.tokens, 256);
  EXPECT_EQ(after(t.sets, run.sets.size()),
            (std::vector<std::string>{"train.steps=4", "train.warmup_steps=1", "train.lr_max=0.002",
                                      "train.lr_min=0.0002", "train.seed=7", "train.eval_every=2",
                                      "train.log_every=1", "train.checkpoint_every=1",
                                      "train.keep_checkpoints=1", "data.path=" + s.data}));
  // A bad override in a run is refused when its training is planned (load_run_config's error).
  SuiteRun bad = run;
  bad.sets.push_back("train.no_such_key=1");
  EXPECT_THROW(make_train(bad, s.data, "x", dir + "/bad", 200, 2e-3, 0.1, 7, 2), Error);
}

TEST(ComparePlan, TrainJobIsReusedResumedOrRefused) {
  const std::string dir = test::temp_dir("plan-job");
  const Suite s = load(dir);
  const TrainSpec t = make_train(s.runs[0], s.data, "x", dir + "/run", 200, 2e-3, 0.1, 7, 2);
  auto j = train_job(t, 0.5);
  ASSERT_TRUE(j.has_value());
  EXPECT_EQ(j->args[0], "train");
  EXPECT_EQ(j->est_s, 0.5 * 256);
  EXPECT_EQ(std::count(j->args.begin(), j->args.end(), "--resume"), 0);
  EXPECT_EQ(*read_json(dir + "/run/compare-run.json"), train_settings(t));
  // A checkpoint to resume from: --resume.
  fs::create_directories(dir + "/run/checkpoints/step-000002");
  j = train_job(t, 0.5);
  ASSERT_TRUE(j.has_value());
  EXPECT_EQ(j->args.back(), dir + "/run");
  EXPECT_EQ(j->args[j->args.size() - 2], "--resume");
  // Completed: nothing to run.
  put(dir + "/run/summary.json", R"({"status": "completed"})");
  EXPECT_FALSE(train_job(t, 0.5).has_value());
  // Other settings, or a folder compare did not make: refused.
  const TrainSpec other = make_train(s.runs[0], s.data, "x", dir + "/run", 200, 2e-3, 0.1, 8, 2);
  try {
    train_job(other, 0.5);
    ADD_FAILURE() << "other settings accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("other settings"), std::string::npos) << e.what();
  }
  put(dir + "/mine/notes.txt", "x");
  const TrainSpec foreign = make_train(s.runs[0], s.data, "x", dir + "/mine", 200, 2e-3, 0.1, 7, 2);
  try {
    train_job(foreign, 0.5);
    ADD_FAILURE() << "a foreign folder accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was not made by cemfrac compare"), std::string::npos);
  }
}

TEST(ComparePlan, TimingsOfAnotherMachineAreTakenAgain) {
  const std::string out = test::temp_dir("plan-machine");
  fs::create_directories(out + "/plan/llama-t2");
  // Timed before the machine was recorded: dropped, and this machine recorded.
  EXPECT_NE(discard_other_machines_timings(out, "here").find("on a machine not recorded"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(out + "/plan/llama-t2"));
  EXPECT_EQ(test::read_file(out + "/plan/machine.txt"), "here\n");
  // The same machine: kept.
  fs::create_directories(out + "/plan/llama-t2");
  EXPECT_EQ(discard_other_machines_timings(out, "here"), "");
  EXPECT_TRUE(fs::exists(out + "/plan/llama-t2"));
  // Another one: dropped, naming it.
  EXPECT_NE(discard_other_machines_timings(out, "there").find("on another machine (here)"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(out + "/plan/llama-t2"));
}

void lm_grid_value(const std::string& dir, const std::string& status, double val_loss) {
  put(dir + "/summary.json",
                   json{{"status", status}, {"last_val_loss", val_loss}}.dump());
}

void gp_grid_value(const std::string& dir, const std::string& status, double rmse) {
  put(gp_result_path(dir),
                   json{{"status", status}, {"val", {{"rmse_posterior", rmse}}}}.dump());
}

std::vector<RunPlan> plans_of(const Suite& s) {
  std::vector<RunPlan> plans;
  for (const SuiteRun& r : s.runs) {
    RunPlan p;
    p.run = &r;
    p.gp = r.task == SuiteTask::kGp;
    plans.push_back(p);
  }
  return plans;
}

TEST(ComparePlan, LearningRateChosenAtTheGridEdges) {
  const std::string out = test::temp_dir("plan-lr");
  const Suite s = load(out);
  const SuiteRun &llama = s.runs[0], &g = s.runs[2];
  // LM: the lowest validation loss is at the grid's top edge; GP: at its bottom edge. A diverged
  // value (its loss would be the lowest) never wins.
  lm_grid_value(lr_dir(out, llama, 1e-3), "completed", 3.2);
  lm_grid_value(lr_dir(out, llama, 3e-3), "diverged", 0.1);
  lm_grid_value(lr_dir(out, llama, 1e-2), "completed", 3.0);
  gp_grid_value(lr_dir(out, g, 1e-3), "completed", 0.40);
  gp_grid_value(lr_dir(out, g, 1e-2), "completed", 0.45);
  std::vector<RunPlan> plans = plans_of(s);
  choose_learning_rates(plans, out);
  EXPECT_EQ(plans[0].lr, 1e-2);
  EXPECT_EQ(plans[1].lr, 1e-2);  // lr_from = "llama"
  EXPECT_EQ(plans[2].lr, 1e-3);
  ASSERT_EQ(plans[0].lr_search.size(), 3u);
  EXPECT_EQ(plans[0].lr_search.at("0.001"), 3.2);
  EXPECT_FALSE(plans[0].lr_search.at("0.003").has_value());
  EXPECT_EQ(plans[2].lr_search.at("0.01"), 0.45);
  // A tie goes to the first value of the grid.
  lm_grid_value(lr_dir(out, llama, 1e-3), "completed", 3.0);
  plans = plans_of(s);
  choose_learning_rates(plans, out);
  EXPECT_EQ(plans[0].lr, 1e-3);
}

TEST(ComparePlan, UnfinishedOrDivergedGrid) {
  const std::string out = test::temp_dir("plan-lr-partial");
  const Suite s = load(out);
  const SuiteRun& llama = s.runs[0];
  lm_grid_value(lr_dir(out, llama, 1e-3), "completed", 3.2);
  lm_grid_value(lr_dir(out, llama, 1e-2), "running", 3.0);  // not finished: not chosen yet
  std::vector<RunPlan> plans = plans_of(s);
  plans.pop_back();  // the GP run's grid is not there at all
  choose_learning_rates(plans, out);
  EXPECT_EQ(plans[0].lr, 0);
  EXPECT_EQ(plans[1].lr, 0);
  EXPECT_EQ(plans[0].lr_search.size(), 1u);  // the values finished so far (a partial report)
  for (double lr : {1e-3, 3e-3, 1e-2}) lm_grid_value(lr_dir(out, llama, lr), "diverged", 9);
  plans = plans_of(s);
  plans.pop_back();
  try {
    choose_learning_rates(plans, out);
    ADD_FAILURE() << "an all-diverged grid was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "run 'llama': every learning rate of the grid diverged");
  }
}

}  // namespace
}  // namespace cemfrac
