// Ctrl-C during a generation (attn generate, attn chat): the first SIGINT asks the running reply
// to stop after its current token, so the command prints what it has, a newline and its stats and
// exits 130 (128 + SIGINT, as a shell reports it); a second SIGINT ends the process at once.
#pragma once

namespace attn::cli {

// Installs the handler (once; later calls do nothing).
void catch_interrupts();
// Whether a SIGINT has arrived since catch_interrupts.
bool interrupted();

constexpr int kInterruptedExit = 130;

}  // namespace attn::cli
