// The text form of each family, defined beside the family (src/exact/softmax_text.cpp, ...).
// mechanism_text.cpp walks the Mechanism variant and calls these overloads, so a family
// without them does not compile.
#pragma once
#include "attn/mechanism.hpp"
#include "mechanism/options.hpp"

namespace attn::mechanism {

// The options the family of `m` reads, as its grammar writes them ("causal", "scale=X", ...).
std::vector<std::string> options_of(const Mechanism& m);

// Reads the family's options (the reader checks leftovers afterwards).
void read_options(OptionReader& r, Softmax& m);
// Writes the canonical options (defaults omitted).
void write_options(OptionWriter& w, const Softmax& m);

void read_options(OptionReader& r, Longformer& m);
void write_options(OptionWriter& w, const Longformer& m);

void read_options(OptionReader& r, BigBird& m);
void write_options(OptionWriter& w, const BigBird& m);

void read_options(OptionReader& r, Linformer& m);
void write_options(OptionWriter& w, const Linformer& m);

void read_options(OptionReader& r, Lsh& m);
void write_options(OptionWriter& w, const Lsh& m);

void read_options(OptionReader& r, Dca& m);
void write_options(OptionWriter& w, const Dca& m);

void read_options(OptionReader& r, Linear& m);
void write_options(OptionWriter& w, const Linear& m);
// retention[:decay=..]: Linear with map=identity, causal, normalize=0 (written as linear:...).
void read_retention(OptionReader& r, Linear& m);

void read_options(OptionReader& r, NormAttn& m);
void write_options(OptionWriter& w, const NormAttn& m);

void read_options(OptionReader& r, Performer& m);
void write_options(OptionWriter& w, const Performer& m);

void read_options(OptionReader& r, Sana& m);
void write_options(OptionWriter& w, const Sana& m);

void read_options(OptionReader& r, PolaFormer& m);
void write_options(OptionWriter& w, const PolaFormer& m);

void read_options(OptionReader& r, Efficient& m);
void write_options(OptionWriter& w, const Efficient& m);

void read_options(OptionReader& r, Gau& m);
void write_options(OptionWriter& w, const Gau& m);

void read_options(OptionReader& r, QSoftmax& m);
void write_options(OptionWriter& w, const QSoftmax& m);

}  // namespace attn::mechanism
