// cemfrac export / cemfrac import: checkpoints to and from Hugging Face transformers directories
// (cemfrac/interop/hf.h, docs/interop.md).
#include <fmt/format.h>
#include <torch/types.h>

#include "cemfrac/core/format_util.h"
#include "cemfrac/interop/hf.h"
#include "cemfrac/model/lm_model.h"
#include "cli/commands.h"

namespace cemfrac::cli {

namespace {

void refuse_other_device(const GlobalOptions& global, const char* command) {
  CEMFRAC_CHECK(global.device.empty() || global.device == "cpu",
                "{}: --device {}: conversion reads and writes files on the CPU; leave --device "
                "out",
                command, global.device);
}

}  // namespace

Command add_export(CLI::App& root, const GlobalOptions& global) {
  struct Flags {
    std::string checkpoint, out;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "export",
      "Write a checkpoint as a Hugging Face transformers directory (GPT2LMHeadModel or "
      "LlamaForCausalLM, with its tokenizer); refuses kinds no stock class computes exactly");
  app->add_option("--checkpoint", f->checkpoint,
                  "Checkpoint directory, or a run directory (its newest complete checkpoint)")
      ->required();
  app->add_option("--out", f->out, "New (or empty) directory for from_pretrained()")->required();
  auto run = [f, &global]() {
    refuse_other_device(global, "export");
    const HfExportResult r = export_hf(f->checkpoint, f->out);
    fmt::print("exported {} as {} ({} tensors) to {}\n", r.checkpoint, hf_class_name(r.arch),
               r.tensors, f->out);
    if (r.tokenizer_files.empty())
      fmt::print("tokenizer: none (the checkpoint has no tokenizer)\n");
    else
      fmt::print("tokenizer: {}\n", fmt::join(r.tokenizer_files, ", "));
    return 0;
  };
  return {app, run};
}

Command add_import(CLI::App& root, const GlobalOptions& global) {
  struct Flags {
    std::string hf, out;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "import",
      "Turn a Hugging Face GPT-2 or Llama directory (config.json + safetensors) into a cemfrac "
      "checkpoint for eval, generate, finetune and Python");
  app->add_option("--hf", f->hf, "transformers model directory (save_pretrained() output)")
      ->required();
  app->add_option("--out", f->out,
                  "New run directory; the checkpoint is OUT/checkpoints/step-000000")
      ->required();
  auto run = [f, &global]() {
    refuse_other_device(global, "import");
    const HfImportResult r = import_hf(f->hf, f->out);
    LmModel meta(r.config, torch::kMeta);
    fmt::print("{:<40} {:>16} {:>14}\n", "tensor", "shape", "numel");
    int64_t total = 0;
    for (const ParamInfo& p : meta->parameter_table()) {
      fmt::print("{:<40} {:>16} {:>14}\n", p.name, fmt::format("{}", fmt::join(p.shape, " x ")),
                 with_commas(p.numel));
      total += p.numel;
    }
    fmt::print("total {} parameters: mixer {}, ffn {}, norm {}, positions {}, tied {}\n",
               with_commas(total), r.config.mixer, r.config.ffn, enum_name(r.config.norm),
               enum_name(r.config.positions), r.config.tie_embeddings ? "yes" : "no");
    for (const std::string& note : r.notes) fmt::print("note: {}\n", note);
    fmt::print("tokenizer: {}\n", r.tokenizer.empty() ? "none" : r.tokenizer);
    fmt::print("wrote {}\n", r.checkpoint_dir);
    return 0;
  };
  return {app, run};
}

}  // namespace cemfrac::cli
