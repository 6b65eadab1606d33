// attn eval-ppl: what an attention mechanism costs a real language model. Perplexity of a text
// under a GGUF model with exact attention and with each mechanism in every layer (or in all
// layers but every k-th, which stays exact), beside the time it took and the KV cache the
// mechanism needs at that context; a table on stdout, CSV + JSON + an SVG chart with --out.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "attn/error.hpp"
#include "attn/gguf.hpp"
#include "attn/info.hpp"
#include "attn/mechanism.hpp"
#include "attn/model.hpp"
#include "attn/tokenizer.hpp"
#include "commands.hpp"
#include "model_option.hpp"
#include "usage.hpp"
#include "io/input_file.hpp"
#include "output_files.hpp"
#include "svg_chart.hpp"

namespace attn::cli {
namespace {

struct EvalArgs {
  std::string model, text_file, out;
  std::vector<std::string> mechanisms;
  int64_t tokens = 4096;
  std::string dtype = "q4_1";
  int threads = 0;
  bool quiet = false;
};

// A row of the table: a mechanism in every layer, except every `exact_every`-th (0: none),
// which keeps exact attention. Text form: MECHANISM[@exact-every=K].
struct Entry {
  std::string text;
  Mechanism mechanism;
  int64_t exact_every = 0;
};

const char* const kDefaultMechanisms[] = {
    "softmax:causal",
    "softmax:causal,window=63:0",
    "softmax:causal,window=255:0",
    "softmax:causal,window=1023:0",
    "softmax:causal,window=255:0,sinks=4",
    "softmax:causal,window=511:0,dilation=2",
    "softmax:causal,strided=64",
    "bigbird:block=64,window=3,global=1,random=2,seed=7,causal",
    "lsh:buckets=32,rounds=2,chunk=64,seed=1,causal",
    "dca:chunk=1024,local=256,theta=100000",
    "softmax:causal,window=255:0@exact-every=4",
};

// The entry that keeps every layer's own mechanism (Gemma 3's windowed local layers and full global
// ones): the model as trained.
constexpr const char* kAsTrained = "as-trained";

Entry parse_entry(const std::string& text) {
  Entry e{text, {}, 0};
  if (text == kAsTrained) return e;
  std::string mech = text;
  if (const size_t at = text.find('@'); at != std::string::npos) {
    mech = text.substr(0, at);
    const std::string rest = text.substr(at + 1), key = "exact-every=";
    char* end = nullptr;
    if (rest.rfind(key, 0) == 0) e.exact_every = std::strtoll(rest.c_str() + key.size(), &end, 10);
    if (rest.rfind(key, 0) != 0 || !end || *end || e.exact_every < 1)
      fail("--mechanism", "expected MECHANISM[@exact-every=K] with K >= 1, got '" + text + "'");
  }
  e.mechanism = parse_mechanism(mech);
  return e;
}

struct Row {
  std::string mechanism, note;
  double perplexity = NAN, seconds = 0, kv_mib = 0, kv_ratio = 1;
};

// A CSV field: quoted, inner quotes doubled.
std::string csv_field(const std::string& s) {
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

int run(const EvalArgs& a) {
  std::vector<Entry> entries;
  for (const std::string& m : a.mechanisms) entries.push_back(parse_entry(m));
  if (entries.empty())
    for (const char* m : kDefaultMechanisms) entries.push_back(parse_entry(m));
  const std::string csv_path = a.out.empty() ? "" : a.out + ".csv", json_path = a.out.empty() ? "" : a.out + ".json",
                    svg_path = a.out.empty() ? "" : a.out + ".svg";
  OutputFiles files({{"--model", a.model}, {"--text", a.text_file}},
                    {{"--out (.csv)", csv_path}, {"--out (.json)", json_path}, {"--out (.svg)", svg_path}});

  const std::string text = io::read_text_file(a.text_file);  // bounded, regular files only
  const Tokenizer tok = Tokenizer::from_gguf(GgufFile::open(a.model));
  std::vector<int32_t> ids = tok.encode(text, false);
  if (static_cast<int64_t>(ids.size()) < a.tokens)
    fail("--text", "'" + a.text_file + "' has " + std::to_string(ids.size()) + " tokens, fewer than --tokens " +
                       std::to_string(a.tokens));
  ids.resize(static_cast<size_t>(a.tokens));
  Decoder d = Decoder::from_gguf(a.model, {a.threads, a.dtype == "f32", a.tokens});
  const int64_t layers = static_cast<int64_t>(d.config().layers.size());
  std::vector<Mechanism> trained;  // each layer's mechanism as the file lays it out
  for (const DecoderLayerSpec& l : d.config().layers) trained.push_back(l.mechanism);
  const bool all_exact = std::all_of(trained.begin(), trained.end(),
                                     [](const Mechanism& m) { return m == Mechanism{Softmax{.causal = true}}; });
  if (a.mechanisms.empty() && !all_exact) entries.insert(entries.begin(), parse_entry(kAsTrained));
  const double kv_row = static_cast<double>(d.kv_bytes_per_token()) / static_cast<double>(layers);  // bytes per key, per layer
  const double kv_full = kv_row * static_cast<double>(layers * a.tokens);
  fmt::print("attn eval-ppl: {} tokens of {}, {} layers, {} matrices; KV cache of exact attention {:.1f} MiB\n", a.tokens,
             a.text_file, layers, a.dtype, kv_full / 1048576.0);
  fmt::print("{:<58} {:>10} {:>8} {:>9} {:>7}\n", "mechanism", "perplexity", "time s", "KV MiB", "KV x");

  std::vector<Row> rows;
  const bool tty = isatty(STDERR_FILENO) != 0;
  for (const Entry& e : entries) {
    Row r{e.text, "", NAN, 0, 0, 1};
    try {
      double kv = 0;
      for (int64_t l = 0; l < layers; ++l) {
        const bool exact = e.exact_every > 0 && l % e.exact_every == 0;
        const Mechanism m = e.text == kAsTrained ? trained[static_cast<size_t>(l)]
                            : exact              ? Mechanism{Softmax{.causal = true}}
                                                 : e.mechanism;
        d.set_mechanism(l, m);
        kv += kv_row * static_cast<double>(info(m, a.tokens).cache_rows);
      }
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<double> nll = token_nll(d, ids, [&](int64_t done, int64_t total) {
        if (!a.quiet && tty) fmt::print(stderr, "\r  {}: {}/{} tokens", e.text, done, total), std::fflush(stderr);
      });
      if (!a.quiet && tty) fmt::print(stderr, "\r{:<90}\r", "");
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      double sum = 0;
      for (double x : nll) sum += x;
      r.perplexity = std::exp(sum / static_cast<double>(nll.size()));
      r.kv_mib = kv / 1048576.0, r.kv_ratio = kv / kv_full;
      fmt::print("{:<58} {:>10.2f} {:>8.1f} {:>9.1f} {:>7.2f}\n", e.text, r.perplexity, r.seconds, r.kv_mib, r.kv_ratio);
    } catch (const Error& err) {
      r.note = err.what();
      fmt::print("{:<58} {:>10} ({})\n", e.text, "n/a", r.note);
    }
    std::fflush(stdout);
    rows.push_back(r);
  }
  d.set_mechanism(-1, Softmax{.causal = true});
  if (a.out.empty()) return 0;

  std::string csv = "mechanism,perplexity,seconds,kv_mib,kv_ratio,note\n";
  nlohmann::json table = {{"model", a.model}, {"tokens", a.tokens}, {"rows", nlohmann::json::array()}};
  ChartPanel by_memory{"perplexity vs KV cache needed", "KV cache at " + std::to_string(a.tokens) + " tokens (MiB)",
                       "perplexity", true, true, {}};
  ChartPanel by_time{"perplexity vs time", "seconds for " + std::to_string(a.tokens) + " tokens", "perplexity", false, true, {}};
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    csv += fmt::format("{},{},{:.3f},{:.2f},{:.4f},{}\n", csv_field(r.mechanism),
                       std::isnan(r.perplexity) ? "" : fmt::format("{:.4f}", r.perplexity), r.seconds, r.kv_mib, r.kv_ratio,
                       csv_field(r.note));
    table["rows"].push_back({{"mechanism", r.mechanism},
                             {"perplexity", std::isnan(r.perplexity) ? nlohmann::json(nullptr) : nlohmann::json(r.perplexity)},
                             {"seconds", r.seconds}, {"kv_mib", r.kv_mib}, {"kv_ratio", r.kv_ratio}, {"note", r.note}});
    if (!std::isnan(r.perplexity)) {
      const bool exact = r.mechanism == "softmax:causal";
      by_memory.points.push_back({std::max(r.kv_mib, 1e-3), r.perplexity, r.mechanism, exact});
      by_time.points.push_back({r.seconds, r.perplexity, r.mechanism, exact});
    }
  }
  files.write_text(csv_path, csv);
  files.write_text(json_path, table.dump(1) + "\n");
  // the chart names the files, not where they lie (a chart is shared; the JSON keeps the paths as given)
  const auto name = [](const std::string& path) { return std::filesystem::path(path).filename().string(); };
  files.write_text(svg_path, svg_scatter({by_memory, by_time}, "attn eval-ppl: " + name(a.model) + ", " +
                                                                   std::to_string(a.tokens) + " tokens of " +
                                                                   name(a.text_file) + " (exact in red)"));
  files.commit();
  fmt::print("wrote {}, {}, {}\n", csv_path, json_path, svg_path);
  return 0;
}

}  // namespace

Runner add_eval_ppl(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* c = app.add_subcommand(
      "eval-ppl",
      "Perplexity of a text under a GGUF model with exact attention and with each mechanism (time, KV cache needed).\n"
      "  attn eval-ppl --model SmolLM2-135M-Instruct.Q4_1.gguf --text book.txt --tokens 4096 --out ppl\n"
      "  attn eval-ppl --model M.gguf --text t.txt -m softmax:causal -m softmax:causal,window=255:0,sinks=4\n"
      "  -m 'softmax:causal,window=255:0@exact-every=4': windowed, but layers 0, 4, 8, ... stay exact");
  c->add_option("--model", a->model, "A GGUF file, or a model's name (attn models)")->required()->transform(model_file());
  c->add_option("--text", a->text_file, "A text file (UTF-8, a regular file of at most 64 MiB) to score")->required()->check(CLI::ExistingFile);
  c->add_option("--tokens", a->tokens, "Tokens of the text to score (the context)")->capture_default_str()->check(in_range(2, 1 << 20));
  c->add_option("-m,--mechanism", a->mechanisms, "MECHANISM[@exact-every=K], repeatable (default: exact, windows 64/256/1024,\n"
                "window + sinks, dilated, strided, BigBird, LSH, DCA, a window with every 4th layer exact: the\n"
                "mechanisms that can run causally, after as-trained (each layer's own: Gemma 3's windows) when\n"
                "the model's layers are not all exact; a non-causal one given here shows as n/a)");
  c->add_option("--dtype", a->dtype, "q4_1: matrices as stored; f32: dequantized once")->capture_default_str()->check(CLI::IsMember({"q4_1", "f32"}));
  c->add_option("--threads", a->threads, "Threads (0 = all cores)")->capture_default_str()->check(in_range(0, 256));
  c->add_option("--out", a->out, "Write OUT.csv, OUT.json and OUT.svg (a chart: perplexity vs KV cache and vs time)");
  c->add_flag("-q,--quiet", a->quiet, "No progress line");
  return [a] { return run(*a); };
}

}  // namespace attn::cli
