// Suite files for the compare tests (tests/compare/, tests/cli/compare_test.cpp): a tiny language-
// model suite over a prepared dataset and a tiny GP suite, each small enough to run in seconds.
#pragma once
#include <string>

#include "tests/test_util.h"

namespace cemfrac::test {

// Two runs on `data` (Llama with a learning-rate grid; CEM taking its rate, test-time T = 1, 2) and
// two claims; extra_head goes into [suite], tail after everything.
inline std::string tiny_suite(const std::string& data, const std::string& extra_head = "",
                              const std::string& tail = "") {
  const std::string llama = source_path("configs/tiny-llama.toml");
  const std::string cem = source_path("configs/tiny-cem-both.toml");
  return "[suite]\nname = \"tiny\"\ndescription = \"test suite\"\ndata = \"" + data +
         "\"\ntokens = 256\nseeds = [1, 2]\nlr = [3e-3]\nlr_search_tokens = 128\nval_points = 2\n"
         "set = [\"model.d_model=32\", \"model.n_layers=1\", \"model.n_heads=2\", "
         "\"model.n_kv_heads=2\", \"model.d_ff=64\", \"model.context=32\", "
         "\"train.micro_batch=2\", "
         "\"train.eval_tokens=128\"]\n" +
         extra_head + "\n[[run]]\nname = \"llama\"\nconfig = \"" + llama +
         "\"\nlr = [1e-3, 1e-2]\n\n[[run]]\nname = \"cem\"\nconfig = \"" + cem +
         "\"\nset = [\"model.n_kv_heads=0\"]\nlr_from = \"llama\"\ntest_time_steps = [1, 2]\n\n"
         "[[claim]]\nid = \"C1\"\ntext = \"CEM beats Llama\"\na = \"cem\"\nb = \"llama\"\n\n"
         "[[claim]]\nid = \"C2\"\ntext = \"two steps beat one\"\na = [\"cem@T=2\"]\nb = "
         "\"cem@T=1\"\n"
         "test = \"not_worse\"\nmargin = 0.01\n" +
         tail;
}

inline std::string write_suite(const std::string& dir, const std::string& text) {
  const std::string path = dir + "/suite.toml";
  write_file(path, text);
  return path;
}

// Two CEM runs (T = 1 with a learning-rate grid and test-time T = 1, 2; T = 2 taking T = 1's rate)
// and the Llama baseline; claims on test RMSE. Small enough for seconds: 3 steps x 2 sequences.
inline std::string gp_suite(const std::string& extra_gp = "", const std::string& tail = "") {
  return "[suite]\nname = \"gp-tiny\"\ndescription = \"GP test suite\"\nseeds = [1, 2]\n"
         "lr = [3e-3]\n\n[gp]\nsteps = 3\nsearch_steps = 2\nbatch = 2\nlayers = 1\n"
         "val_seqs = 4\ntest_seqs = 4\neval_seed = 5\n" +
         extra_gp +
         "\n[[run]]\nname = \"fixed-t1\"\ntask = \"gp\"\nvariant = \"fixed\"\nT = 1\n"
         "lr = [1e-3, 1e-2]\ntest_time_steps = [1, 2]\n\n"
         "[[run]]\nname = \"fixed-t2\"\ntask = \"gp\"\nT = 2\nlr_from = \"fixed-t1\"\n\n"
         "[[run]]\nname = \"llama\"\ntask = \"gp\"\nmodel = \"llama\"\nsteps = 2\nseeds = [1]\n\n"
         "[[claim]]\nid = \"G1\"\ntext = \"T = 2 beats T = 1\"\na = \"fixed-t2\"\nb = "
         "\"fixed-t1\"\n\n"
         "[[claim]]\nid = \"G2\"\ntext = \"two test-time steps are no worse\"\n"
         "a = \"fixed-t1@T=2\"\nb = \"fixed-t1@T=1\"\ntest = \"not_worse\"\nmargin = 0.01\n" +
         tail;
}

}  // namespace cemfrac::test
