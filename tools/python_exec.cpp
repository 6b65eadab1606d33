#include "python_exec.hpp"

#include <fmt/core.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace attn::cli {
namespace {

// `python -c` code that imports attn first and runs the module as -m would (sys.argv[1] is the
// command's name for messages, sys.argv[2] the module, the rest its arguments).
const char* const kBootstrap = R"(import runpy, sys
command, module = sys.argv[1], sys.argv[2]
del sys.argv[1:3]
said = f"error: {command}: " if command else "error: "
try:
    import attn
except ModuleNotFoundError as e:
    if e.name is not None and e.name.split(".")[0] != "attn":
        sys.exit(f"{said}attn's Python package needs the module {e.name!r}, which {sys.executable} lacks: "
                 f"pip install {e.name.split('.')[0]}")
    sys.exit(f"{said}this Python ({sys.executable}) has no attn module; install it (pip install . in "
             f"attn's source, or its wheel) or set ATTN_PYTHON to a Python that has it")
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except ModuleNotFoundError as e:
    if e.name is None or e.name.split(".")[0] == "attn":
        raise
    sys.exit(f"{said}needs the Python module {e.name!r}, which {sys.executable} lacks: pip install {e.name.split('.')[0]}")
)";

std::vector<std::string> python_argv(const std::string& command, const std::string& module,
                                     const std::vector<std::string>& args) {
  std::vector<std::string> all = {find_python(), "-c", kBootstrap, command, module};
  all.insert(all.end(), args.begin(), args.end());
  return all;
}

std::vector<char*> c_argv(std::vector<std::string>& all) {
  std::vector<char*> argv;
  for (std::string& s : all) argv.push_back(s.data());
  argv.push_back(nullptr);
  return argv;
}

void cannot_start(const std::string& command, const std::string& module, const std::string& py, int err) {
  fmt::print(stderr, "error: {} runs the Python package (python -m {}); cannot start '{}': {}\n"
                     "  set ATTN_PYTHON to a Python with attn installed (pip install .)\n",
             command, module, py, std::strerror(err));
}

}  // namespace

std::string find_python() {
  if (const char* p = std::getenv("ATTN_PYTHON"); p && *p) return p;
  if (access(".venv/bin/python", X_OK) == 0) return ".venv/bin/python";
  return "python3";
}

int exec_python_module(const std::string& command, const std::string& module, const std::vector<std::string>& args) {
  std::vector<std::string> all = python_argv(command, module, args);
  std::vector<char*> argv = c_argv(all);
  std::fflush(stdout);
  std::fflush(stderr);
  execvp(argv[0], argv.data());
  cannot_start(command, module, all[0], errno);
  return 2;
}

PythonRun run_python_module(const std::string& command, const std::string& module, const std::vector<std::string>& args) {
  std::vector<std::string> all = python_argv(command, module, args);
  std::vector<char*> argv = c_argv(all);
  int fds[2];
  PythonRun run;
  if (pipe(fds) != 0) {
    cannot_start(command, module, all[0], errno);
    return run;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    execvp(argv[0], argv.data());
    cannot_start(command, module, all[0], errno);
    _exit(127);
  }
  close(fds[1]);
  if (pid < 0) {
    cannot_start(command, module, all[0], errno);
    close(fds[0]);
    return run;
  }
  char buf[4096];
  for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    run.out.append(buf, static_cast<size_t>(got));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

}  // namespace attn::cli
