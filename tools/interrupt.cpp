#include "interrupt.hpp"

#include <csignal>

namespace attn::cli {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_interrupt(int) {
  if (g_interrupted) {  // the second Ctrl-C: the default action, now
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  g_interrupted = 1;
}

}  // namespace

void catch_interrupts() {
  static const bool installed = [] {
    struct sigaction sa = {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // reads of stdin (attn chat) go on; the reply loop polls the flag
    return sigaction(SIGINT, &sa, nullptr) == 0;
  }();
  (void)installed;
}

bool interrupted() { return g_interrupted != 0; }

}  // namespace attn::cli
