// attn run: attention on .npy inputs, writing .npy outputs.
#include <fmt/core.h>


#include <map>

#include "attn/attn.hpp"
#include "commands.hpp"
#include "output_files.hpp"

namespace attn::cli {
namespace {

struct RunArgs {
  std::string mechanism = "softmax", q, k, v, out, lse, probs, final_state, layout = "bhnd", mask, bias, wq, wk, w, isa, form,
      block_mask;
  std::vector<int64_t> block_size = {128, 128};
  std::vector<std::string> params;  // NAME=file.npy
  std::vector<int64_t> kv_lengths;
  std::vector<float> alibi;
  int threads = 0;
  bool reference = false, explain = false;
};

// q/k/v arrays: 4-D in the chosen layout, or 3-D (one batch).
TensorView view_of(NpyArray& a, const std::string& name, Layout layout) {
  if (a.dtype == DType::boolean) fail(name, "must be float32 or float16, got bool");
  std::vector<int64_t> s = a.shape;
  if (s.size() == 3) s.insert(s.begin(), 1);
  if (s.size() != 4)
    fail(name, "must have 4 dimensions (" + std::string(layout == Layout::bhnd ? "B, H, N, D" : "B, N, H, D") +
                   ") or 3 (one batch), got " + std::to_string(a.shape.size()));
  if (layout == Layout::bhnd) return make_view(a.bytes.data(), a.dtype, s[0], s[1], s[2], s[3], layout);
  return make_view(a.bytes.data(), a.dtype, s[0], s[2], s[1], s[3], layout);
}

// Masks and biases: (N, M), (H|1, N, M) or (B|1, H|1, N, M).
TensorView mask_view(NpyArray& a, const std::string& name) {
  std::vector<int64_t> s = a.shape;
  if (s.size() < 2 || s.size() > 4) fail(name, "must have 2 to 4 dimensions (.., N, M), got " + std::to_string(s.size()));
  while (s.size() < 4) s.insert(s.begin(), 1);
  return make_view(a.bytes.data(), a.dtype, s[0], s[1], s[2], s[3]);
}

// --param NAME=file.npy (and the aliases --wq/--wk/--w): arrays kept alive in `store`.
void add_param(const std::string& name, const std::string& path, std::map<std::string, NpyArray>& store, Params& params) {
  if (name.empty()) fail("--param", "expected NAME=file.npy, got '=" + path + "'");
  if (params.count(name)) fail("--param", "'" + name + "' is given twice");
  NpyArray& a = store[name] = read_npy(path);
  params[name] = make_array_view(a.bytes.data(), a.dtype, a.shape);
}

int run(const RunArgs& r) {
  const Layout layout = r.layout == "bnhd" ? Layout::bnhd : Layout::bhnd;
  const Mechanism mech = parse_mechanism(r.mechanism);
  std::vector<std::pair<std::string, std::string>> inputs = {
      {"--q", r.q}, {"--k", r.k}, {"--v", r.v}, {"--mask", r.mask}, {"--bias", r.bias}, {"--block-mask", r.block_mask},
      {"--wq", r.wq}, {"--wk", r.wk}, {"--w", r.w}};
  for (const std::string& p : r.params) inputs.emplace_back("--param", p.substr(p.find('=') + 1));
  OutputFiles files(inputs, {{"--out", r.out}, {"--lse", r.lse}, {"--probs", r.probs}, {"--final-state", r.final_state}});
  NpyArray qa = read_npy(r.q), ka = read_npy(r.k), va = read_npy(r.v);
  const TensorView q = view_of(qa, r.q, layout), k = view_of(ka, r.k, layout), v = view_of(va, r.v, layout);
  AttendOptions opt;
  opt.threads = r.threads;
  opt.form = r.form;
  if (r.reference) {
    if (!r.form.empty() && r.form != "reference") fail("--reference", "conflicts with --form " + r.form);
    opt.form = "reference";
  }
  opt.key_padding_lengths = r.kv_lengths;
  opt.alibi_slopes = r.alibi;
  opt.return_lse = !r.lse.empty();
  opt.return_probs = !r.probs.empty();
  opt.return_final_state = !r.final_state.empty();
  NpyArray ma, ba, bm;
  if (!r.block_mask.empty()) {
    bm = read_npy(r.block_mask);
    if (bm.dtype != DType::boolean) fail(r.block_mask, "--block-mask must be a bool array, got " + dtype_name(bm.dtype));
    opt.block_mask = mask_view(bm, r.block_mask);
    opt.block_size = {r.block_size[0], r.block_size[1]};
  }
  if (!r.mask.empty()) {
    ma = read_npy(r.mask);
    if (ma.dtype != DType::boolean) fail(r.mask, "--mask must be a bool array (use --bias for float masks), got " + dtype_name(ma.dtype));
    opt.mask = mask_view(ma, r.mask);
  }
  if (!r.bias.empty()) {
    ba = read_npy(r.bias);
    opt.bias = mask_view(ba, r.bias);
  }
  std::map<std::string, NpyArray> param_arrays;
  for (const std::string& p : r.params) {
    const size_t eq = p.find('=');
    if (eq == std::string::npos) fail("--param", "expected NAME=file.npy, got '" + p + "'");
    add_param(p.substr(0, eq), p.substr(eq + 1), param_arrays, opt.params);
  }
  for (auto [name, path] : {std::pair{"wq", &r.wq}, {"wk", &r.wk}, {"w", &r.w}})
    if (!path->empty()) add_param(name, *path, param_arrays, opt.params);
  if (!r.isa.empty()) opt.isa = parse_isa(r.isa, "--isa");
  if (r.explain) {
    opt.return_lse = !r.lse.empty();
    opt.return_probs = !r.probs.empty();
    fmt::print("{}", explain(q, k, v, mech, opt).text());
    return 0;
  }
  if (r.out.empty()) fail("--out", "is required (except with --explain)");
  const AttendResult res = attend(q, k, v, mech, opt);
  const auto& o = res.out.view();
  std::vector<int64_t> oshape = layout == Layout::bhnd ? std::vector<int64_t>{o.shape[0], o.shape[1], o.shape[2], o.shape[3]}
                                                       : std::vector<int64_t>{o.shape[0], o.shape[2], o.shape[1], o.shape[3]};
  if (qa.shape.size() == 3) oshape.erase(oshape.begin());
  // attend() allocates the output contiguous in q's layout and dtype (float32 or float16 here),
  // which is exactly the .npy order of `oshape`.
  files.write(r.out, o.dtype, oshape, o.data);
  const auto& s = q.shape;
  if (!r.lse.empty()) files.write(r.lse, DType::f32, {s[0], s[1], s[2]}, res.lse.view().data);
  if (!r.probs.empty()) files.write(r.probs, DType::f32, {s[0], s[1], s[2], k.shape[2]}, res.probs.view().data);
  if (!r.final_state.empty()) {
    const auto& f = res.final_state.view().shape;
    files.write(r.final_state, DType::f32, {f[0], f[1], f[2], f[3]}, res.final_state.view().data);
  }
  files.commit();
  fmt::print("{}: q {} -> {}\n", to_string(mech), describe(q), r.out);
  return 0;
}

}  // namespace

Runner add_run(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* c = app.add_subcommand("run", "Attention on .npy files: out = attend(q, k, v, mechanism)");
  c->footer(
      "Example:\n  attn run --mechanism softmax:causal --q q.npy --k k.npy --v v.npy --out o.npy --lse l.npy\n"
      "Arrays are float32 or float16, C order. With --layout bhnd (default) q is (B, H, N, D);\n"
      "with bnhd it is (B, N, H, D) (as in flash-attn and most model code). A 3-D array is one batch.\n"
      "k and v may have fewer heads than q (MQA/GQA) if that number divides q's.\n"
      "  attn run -m softmax:causal --q q.npy --k k.npy --v v.npy --explain      (which form runs, and why)\n"
      "Mechanism text: softmax[:causal,scale=S,window=L:R,softcap=C,score=dot|cosine|additive,\n"
      "  entropy_scale=TRAIN_LEN,dropout=P,seed=N]. Causal is bottom-right aligned (query i sees\n"
      "  keys j <= i + M - N); rows that see no key give zeros and lse = -inf.");
  c->add_option("-m,--mechanism", args->mechanism, "Mechanism text form")->capture_default_str();
  c->add_option("--q", args->q, "Queries .npy")->required()->check(CLI::ExistingFile);
  c->add_option("--k", args->k, "Keys .npy")->required()->check(CLI::ExistingFile);
  c->add_option("--v", args->v, "Values .npy")->required()->check(CLI::ExistingFile);
  c->add_option("--out", args->out, "Output .npy (same layout as q; float16 stays float16); not needed with --explain");
  c->add_option("--lse", args->lse, "Also write the row log-sum-exp, (B, H, N) float32");
  c->add_option("--probs", args->probs, "Also write the weights (B, H, N, M) float32 (before dropout)");
  c->add_option("--final-state", args->final_state,
                "Also write the recurrent state after the last token (linear attention), (B, H, F, Dv [+ 1]) float32; "
                "continue a sequence with --param initial_state=FILE");
  c->add_option("--layout", args->layout, "Memory layout of q, k, v, out")->check(CLI::IsMember({"bhnd", "bnhd"}))->capture_default_str();
  c->add_option("--kv-lengths", args->kv_lengths, "Key padding: valid keys per batch entry");
  c->add_option("--mask", args->mask, "Boolean mask .npy, (N, M) / (H, N, M) / (B, H, N, M); true = attend");
  c->add_option("--bias", args->bias, "Additive float bias .npy, same shapes as --mask");
  c->add_option("--alibi", args->alibi, "ALiBi slopes, one per query head");
  c->add_option("--block-mask", args->block_mask,
                "Boolean block mask .npy, (ceil(N/BQ), ceil(M/BK)) / (H, ..) / (B, H, ..); false hides the block");
  c->add_option("--block-size", args->block_size, "BQ BK: query rows and keys per block of --block-mask")
      ->expected(2)->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--param", args->params,
                "A named parameter tensor the mechanism takes, NAME=file.npy (repeatable); e.g. for\n"
                "score=additive: --param wq=wq.npy --param wk=wk.npy --param w=w.npy");
  c->add_option("--wq", args->wq, "Same as --param wq=FILE (additive score: Wq (A, D))");
  c->add_option("--wk", args->wk, "Same as --param wk=FILE (additive score: Wk (A, D))");
  c->add_option("--w", args->w, "Same as --param w=FILE (additive score: w (A))");
  c->add_option("--threads", args->threads, "Threads (0 = all cores, at most 256)")->capture_default_str()
      ->check(CLI::Range(0, 256));
  c->add_option("--isa", args->isa, "Force a kernel set: portable (or scalar), avx2, avx512");
  c->add_option("--form", args->form,
                "Force an implementation (softmax: rows, tiled, reference); default: the first that supports the call");
  c->add_flag("--reference", args->reference, "Same as --form reference: the float64 reference (slow, exact)");
  c->add_flag("--explain", args->explain,
              "Print which form would run and why the others would not (validates the inputs; writes nothing)");
  return [args] { return run(*args); };
}

}  // namespace attn::cli
