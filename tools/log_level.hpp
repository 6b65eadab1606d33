// attn --log-level: how much the commands say on stderr beside their results and errors.
//   error: results and errors only (no progress lines, no speed and cache figures)
//   warn:  the same, with warnings
//   info:  the default: progress lines and the figures after a reply
//   debug: also what a model load did (file, tensor types, threads, ISA, options)
#pragma once

namespace attn::cli {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

inline LogLevel g_log_level = LogLevel::info;  // set once by main, after parsing

// Whether messages of level `l` are shown.
inline bool logs(LogLevel l) { return static_cast<int>(l) <= static_cast<int>(g_log_level); }

}  // namespace attn::cli
