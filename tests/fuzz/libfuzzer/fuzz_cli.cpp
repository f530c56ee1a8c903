// libFuzzer target: `roofline` command lines, run in-process through the commands' own entry points (the
// registry of src/cli, as main() dispatches them). A command may refuse its line (exit status 1 or 2 with one
// "error: ..." line); an exception escaping it, a sanitizer report, another status or a hang is a defect.
// Input: the first byte picks the command (plan, bench, inspect, tokenize, template, synth, quantize,
// perplexity, imatrix); the rest, split at newlines, are its arguments. Words stand for files of the
// harness's temp folder: @m a tiny Qwen3 model (GGUF, F16), @o an output file, @t a text file, @j a
// messages JSON file, @i an imatrix file (written by the imatrix command when @o names one).
// Kept out: a path of any other folder (no '/'), a synthetic model other than tiny-* except for plan
// (plan only counts bytes), and numbers past what runs in a moment (plan: 1024 after -np, 2^20 elsewhere;
// bench 16, the other commands 64): those are long runs, not defects (`plan -np 65536` on a T4 takes a
// minute in its fit loop). The commands run in the temp folder. ROOFLINE_FUZZ_CLI_VERBOSE=1 shows their output.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "engine/roofline_model.h"
#include "tests/fuzz/libfuzzer/fuzz_common.h"

using namespace roofline;

namespace {

const char* const kCommands[] = {"plan", "bench", "inspect", "tokenize", "template", "synth", "quantize", "perplexity", "imatrix"};

const fuzz::TempDir& temp() {
  static const fuzz::TempDir dir("fuzz-cli");
  return dir;
}

std::string temp_file(const char* name) { return (temp().path() / name).string(); }

// Runs `roofline NAME ARGS...` in this process; the exit status.
int run_command(const std::string& name, const std::vector<std::string>& args) {
  const cli::Command* command = nullptr;
  for (const cli::Command& c : cli::command_registry())
    if (c.name == name) command = &c;
  if (!command) fuzz::defect("fuzz_cli", ("no command " + name).c_str());
  std::vector<std::string> words{"roofline " + name};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  return command->run((int)words.size(), argv.data());
}

// The files the words @m, @t, @j stand for, made once.
void make_inputs() {
  static const bool made = [] {
    // The commands run in the temp folder, so that an output file named without a folder lands there.
    if (chdir(temp().path().c_str()) != 0) fuzz::defect("fuzz_cli", "cannot enter the temp folder");
    set_host_read_probe_bytes_for_test(size_t(8) << 20);  // bench and plan probe the host: 1 GiB is ~10 s under ASan
    const std::string model = temp_file("tiny.gguf");
    if (run_command("synth", {"synthetic:tiny-qwen3:F16", "-o", model, "-t", "1"}) != 0) fuzz::defect("fuzz_cli", "synth of the tiny model failed");
    std::ofstream(temp_file("text.txt")) << "Once upon a time there was a little model that read every weight once. "
                                            "It ran fast, and it told stories to the other models all night long.\n";
    std::ofstream(temp_file("messages.json")) << R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])";
    return true;
  }();
  (void)made;
}

// The largest number written in a word ("-np=9", "16,512", "1e9" ...), or 0 when it has none.
double largest_number(const std::string& word) {
  double most = 0;
  const char* s = word.c_str();
  for (size_t i = 0; i < word.size(); ++i) {
    const bool starts = std::isdigit((unsigned char)s[i]) && (i == 0 || (!std::isdigit((unsigned char)s[i - 1]) && s[i - 1] != '.'));
    if (!starts) continue;
    const double x = std::strtod(s + i, nullptr);
    if (std::isnan(x) || std::fabs(x) > most) most = std::isnan(x) ? HUGE_VAL : std::fabs(x);
  }
  return most;
}

bool allowed(const std::string& command, const std::vector<std::string>& args) {
  const bool plan = command == "plan";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.find('/') != std::string::npos || a.find("..") != std::string::npos) return false;
    // A model spec (synthetic:SHAPE:MIX, or synth's SHAPE:MIX) of a real size computes for minutes; JSON
    // (template's --kwargs) may hold colons.
    const bool json = !a.empty() && (a[0] == '{' || a[0] == '[');
    if (!plan && !json && a.find(':') != std::string::npos && a.find("tiny-") == std::string::npos) return false;
    const bool slots = (i > 0 && (args[i - 1] == "-np" || args[i - 1] == "--parallel")) || a.rfind("-np=", 0) == 0 ||
                       a.rfind("--parallel=", 0) == 0;
    const double cap = plan ? (slots ? 1024 : 1048576) : command == "bench" ? 16 : 64;
    if (largest_number(a) > cap) return false;
    if (command == "bench" && std::count(a.begin(), a.end(), ',') > 2) return false;  // each list multiplies the runs
  }
  return true;
}

std::string substitute(const std::string& word) {
  if (word == "@m") return temp_file("tiny.gguf");
  if (word == "@o") return temp_file("out.gguf");
  if (word == "@t") return temp_file("text.txt");
  if (word == "@j") return temp_file("messages.json");
  if (word == "@i") return temp_file("out.imatrix");
  return word;
}

// The commands' output goes to /dev/null (libFuzzer's own lines stay), unless ROOFLINE_FUZZ_CLI_VERBOSE.
class QuietOutput {
 public:
  QuietOutput() {
    static const bool verbose = std::getenv("ROOFLINE_FUZZ_CLI_VERBOSE") != nullptr;
    if (verbose) return;
    std::fflush(stdout);
    std::fflush(stderr);
    null_ = open("/dev/null", O_WRONLY);
    saved_out_ = dup(1);
    saved_err_ = dup(2);
    dup2(null_, 1);
    dup2(null_, 2);
  }
  ~QuietOutput() {
    if (null_ < 0) return;
    std::fflush(stdout);
    std::fflush(stderr);
    dup2(saved_out_, 1);
    dup2(saved_err_, 2);
    close(saved_out_);
    close(saved_err_);
    close(null_);
  }
  QuietOutput(const QuietOutput&) = delete;
  QuietOutput& operator=(const QuietOutput&) = delete;

 private:
  int null_ = -1, saved_out_ = -1, saved_err_ = -1;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 512) return 0;
  make_inputs();
  const std::string command = kCommands[data[0] % (sizeof(kCommands) / sizeof(kCommands[0]))];
  std::vector<std::string> args;
  std::string word;
  for (size_t i = 1; i <= size; ++i) {
    if (i == size || data[i] == '\n') {
      if (i > 1) args.push_back(word);
      word.clear();
    } else if (data[i] == '\0') {
      return 0;  // argv cannot hold a NUL
    } else {
      word += (char)data[i];
    }
  }
  if (args.size() > 24 || !allowed(command, args)) return 0;
  for (std::string& a : args) a = substitute(a);
  // bench's defaults (-p 512 -n 128, five repetitions) take ~10 s under ASan: small ones first, which the
  // input's own flags override (a flag given twice takes its last value).
  if (command == "bench") args.insert(args.begin(), {"-p", "16", "-n", "4", "-r", "1"});
  int status = 0;
  try {
    QuietOutput quiet;
    status = run_command(command, args);
  } catch (const std::exception& e) {
    fuzz::defect(command.c_str(), e.what());
  }
  // 0 done, 1 refused at run time, 2 a usage error: each with its line. Anything else is not a status the
  // commands document (kExitStatusHelp).
  if (status < 0 || status > 2) fuzz::defect(command.c_str(), ("exit status " + std::to_string(status)).c_str());
  std::error_code ec;
  std::filesystem::remove(temp_file("out.gguf"), ec);
  std::filesystem::remove(temp_file("out.imatrix"), ec);
  return 0;
}
