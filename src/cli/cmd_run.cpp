// `roofline run -m MODEL -p PROMPT` (or -f FILE, or the prompt on stdin): prints the prompt, streams
// the generated text on stdout, then one line on stderr with prompt and generation speed measured
// separately (so `> out.txt` keeps only the text). `roofline chat -m MODEL` (= `run -cnv`): an
// interactive conversation through the model's chat template (engine/chat_session.h), with a system
// prompt (-sys), history, /exit, /clear, streaming replies and a speed line on stderr per reply.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "cli/command.h"
#include "cli/draft_options.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/chat_session.h"
#include "engine/sampler.h"
#include "engine/speculative.h"

namespace roofline::cli {
namespace {

std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted = true; }

std::string read_all(std::istream& in) {
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string read_prompt_file(const std::string& path) {
  if (path == "-") return read_all(std::cin);
  return read_file_or_fail(path, "-f");
}

void print_speed(int n_prompt, double prompt_s, int n_gen, double gen_s) {
  std::fprintf(stderr, "prompt: %d tokens in %.2f s, %.2f tok/s | generation: %d tokens in %.2f s, %.2f tok/s\n", n_prompt,
               prompt_s, prompt_s > 0 ? n_prompt / prompt_s : 0.0, n_gen, gen_s, n_gen > 0 && gen_s > 0 ? n_gen / gen_s : 0.0);
}

void write_out(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// Prints bytes as they become complete UTF-8 characters (a character may span several tokens).
class Utf8Printer {
 public:
  void add(const std::string& bytes) {
    pending_ += bytes;
    size_t i = pending_.size(), back = 0;
    while (back < 4 && back < i && ((unsigned char)pending_[i - 1 - back] & 0xC0) == 0x80) ++back;
    size_t end = i;
    if (back < i) {
      const unsigned char lead = (unsigned char)pending_[i - 1 - back];
      const size_t need = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1;
      if (back + 1 < need) end = i - 1 - back;
    }
    if (end) {
      write_out(pending_.substr(0, end));
      pending_.erase(0, end);
    }
  }
  void flush() {
    write_out(pending_);
    pending_.clear();
  }

 private:
  std::string pending_;
};

struct RunArgs {
  std::string prompt, file, system_prompt, template_file, template_kwargs;
  bool prompt_given = false, chat = false, no_display_prompt = false, no_bos = false;
  int n_predict = 128;
  SamplingParams sampling;
};

// One prompt, raw (no chat template): llama-cli's completion mode. With a draft model each step of the
// target verifies the draft's tokens (engine/speculative.h); the text is the same.
int generate_once(Engine& engine, const Tokenizer& tokenizer, const RunArgs& ra, Drafter* drafter) {
  std::vector<int32_t> tokens = tokenizer.encode(ra.prompt, !ra.no_bos, true);
  if (tokens.empty()) fail("the prompt is empty after tokenization");
  const int n_ctx = engine.options().n_ctx;
  if ((int)tokens.size() >= n_ctx) fail("the prompt has {} tokens, the context only {} (-c)", tokens.size(), n_ctx);
  const int seq = engine.memory().create_sequence(false);
  Sampler sampler(ra.sampling, engine.n_vocab());
  if (!ra.no_display_prompt) write_out(ra.prompt);

  const auto t0 = std::chrono::steady_clock::now();
  SpeculativeDecoder decoder(engine, drafter);
  std::vector<float> logits = decoder.prefill(seq, tokens);
  const auto t1 = std::chrono::steady_clock::now();

  Utf8Printer printer;
  std::vector<int32_t> history = tokens;
  int generated = 0;
  const int room = n_ctx - (int)tokens.size();
  const int limit = ra.n_predict < 0 ? room : std::min(ra.n_predict, room);
  const bool greedy = greedy_from_raw_logits(ra.sampling);
  std::vector<int32_t> emitted;
  if (limit > 0) emitted.push_back(sampler.sample(logits.data(), history).token);
  history.insert(history.end(), emitted.begin(), emitted.end());
  bool ended = false;
  while (!emitted.empty()) {
    // Tokens print one by one, whether a step gave one or several.
    for (int32_t next : emitted) {
      if (g_interrupted) {
        ended = true;
        break;
      }
      ++generated;
      if (tokenizer.is_eog(next)) {
        ended = true;
        break;
      }
      printer.add(tokenizer.token_to_piece(next, false));
      if (generated == limit) ended = true;
    }
    emitted.clear();
    if (ended) break;
    decoder.round(seq, history, limit - generated, sampler, greedy, emitted);
  }
  printer.flush();
  write_out("\n");
  const auto t2 = std::chrono::steady_clock::now();
  print_speed((int)tokens.size(), std::chrono::duration<double>(t1 - t0).count(), generated,
              std::chrono::duration<double>(t2 - t1).count());
  if (drafter) {
    const DraftStats& st = decoder.stats();
    std::fprintf(stderr, "draft: %lld of %lld draft tokens accepted (%.1f%%) in %lld drafts\n", (long long)st.accepted,
                 (long long)st.drafted, 100.0 * st.acceptance(), (long long)st.drafts);
  }
  decoder.release(seq);
  return 0;
}

// Reads one message: lines ending in a backslash continue it. False at the end of input.
bool read_message(std::string& message) {
  message.clear();
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty() && line.back() == '\\') {
      line.pop_back();
      message += line + "\n";
      continue;
    }
    message += line;
    return true;
  }
  return !message.empty();
}

int chat_loop(Engine& engine, std::shared_ptr<const Tokenizer> tokenizer, const Model& model, const std::string& name,
              const RunArgs& ra) {
  std::string source;
  if (!ra.template_file.empty()) {
    source = read_file_or_fail(ra.template_file, "--chat-template-file");
  } else {
    source = chat_template_from_metadata(model.metadata());
    if (source.empty()) {
      log_warn("the model has no chat template; using ChatML (--chat-template-file gives another)");
      source = kChatMlTemplate;
    }
  }
  std::shared_ptr<const ChatTemplate> tmpl;
  try {
    tmpl = std::make_shared<const ChatTemplate>(source);
  } catch (const Error& e) {
    fail("{}: {}", ra.template_file.empty() ? "the model's chat template" : "--chat-template-file " + ra.template_file, e.what());
  }
  ChatSession::Options o;
  o.system_prompt = ra.system_prompt;
  o.n_predict = ra.n_predict;
  o.sampling = ra.sampling;
  if (!ra.template_kwargs.empty()) {
    try {
      o.template_kwargs = nlohmann::ordered_json::parse(ra.template_kwargs);
    } catch (const nlohmann::json::exception& e) {
      fail("--chat-template-kwargs is not valid JSON: {}", e.what());
    }
    if (!o.template_kwargs.is_object()) fail("--chat-template-kwargs must be a JSON object");
  }
  ChatSession session(engine, std::move(tokenizer), tmpl, o);

  const bool tty = isatty(0);
  if (tty)
    std::fprintf(stderr, "chat with %s: /exit or Ctrl-D ends, /clear forgets the conversation, a line ending in \\ "
                         "continues; Ctrl-C stops a reply\n", name.c_str());
  bool first = true;
  for (;;) {
    std::string message;
    if (first && ra.prompt_given) {
      message = ra.prompt;
    } else {
      if (tty) write_out("> ");
      g_interrupted = false;
      if (!read_message(message)) break;
    }
    first = false;
    if (message == "/exit" || message == "/quit" || message == "/bye") break;
    if (message == "/clear") {
      session.clear();
      std::fprintf(stderr, "(conversation cleared)\n");
      continue;
    }
    if (message == "/help") {
      std::fprintf(stderr, "/exit ends, /clear forgets the conversation, a line ending in \\ continues the message\n");
      continue;
    }
    if (message.find_first_not_of(" \t\n") == std::string::npos) continue;
    g_interrupted = false;
    ChatTurnStats st;
    try {
      st = session.reply(message, write_out, &g_interrupted);
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      continue;
    }
    write_out("\n");
    if (st.dropped_messages) std::fprintf(stderr, "(%d oldest messages dropped to fit the context)\n", st.dropped_messages);
    if (st.context_full) std::fprintf(stderr, "(the context is full; /clear to start over)\n");
    print_speed(st.fed_tokens, st.prompt_seconds, st.generated_tokens, st.generation_seconds);
  }
  return 0;
}

int run_body(int argc, char** argv, bool chat_command) {
  CLI::App app{chat_command ? "Chat with a model in the terminal, through its chat template"
                            : "Generate text from a prompt (or chat with -cnv)"};
  ModelArgs margs;
  add_model_options(app, margs);
  DraftArgs dargs;
  add_draft_options(app, dargs);
  RunArgs ra;
  ra.chat = chat_command;
  if (chat_command) ra.n_predict = -1;
  app.add_option("-p,--prompt", ra.prompt, chat_command ? "first message (then the conversation goes on)" : "prompt text");
  app.add_option("-f,--file", ra.file, "read the prompt from a file (- : stdin)");
  app.add_option("-n,--n-predict", ra.n_predict, "tokens to generate per reply (-1: until the end of generation or context)")
      ->capture_default_str();
  if (!chat_command) app.add_flag("--conversation", ra.chat, "chat in the terminal, as roofline chat (-cnv)");
  app.add_option("--system-prompt", ra.system_prompt, "chat: the system prompt (-sys)");
  app.add_option("--chat-template-file", ra.template_file, "chat: a Jinja chat template to use instead of the model's");
  app.add_option("--chat-template-kwargs", ra.template_kwargs, "chat: JSON object of extra template variables, e.g. {\"enable_thinking\":false}");
  app.add_flag("--no-display-prompt", ra.no_display_prompt, "do not print the prompt before the generated text");
  SamplingParams& sp = ra.sampling;
  app.add_option("--temp", sp.temperature, "temperature (0 or below: greedy)")->capture_default_str();
  app.add_option("--top-k", sp.top_k, "top-k (0: off)")->capture_default_str();
  app.add_option("--top-p", sp.top_p, "top-p (1: off)")->capture_default_str();
  app.add_option("--min-p", sp.min_p, "min-p (0: off)")->capture_default_str();
  app.add_option("--typical", sp.typical_p, "locally typical sampling p (1: off)")->capture_default_str();
  app.add_option("--repeat-penalty", sp.repeat_penalty, "repetition penalty (1: off)")->capture_default_str();
  app.add_option("--repeat-last-n", sp.repeat_last_n, "tokens the penalties look back at (-1: all, 0: off)")->capture_default_str();
  app.add_option("--presence-penalty", sp.presence_penalty, "presence penalty")->capture_default_str();
  app.add_option("--frequency-penalty", sp.frequency_penalty, "frequency penalty")->capture_default_str();
  int64_t seed = -1;
  app.add_option("-s,--seed", seed, "random seed (-1: random)")->capture_default_str();
  app.add_flag("--no-bos", ra.no_bos, "do not add the BOS token even if the model asks for it");
  // llama-cli's spellings: -cnv, -sys, -no-cnv.
  std::vector<std::string> args;
  for (std::string& a : normalize_llama_flags(argc, argv)) {
    if (a == "-cnv" && chat_command) continue;  // chat is one already
    if (a == "-no-cnv" && !chat_command) continue;  // run's default
    args.push_back(a == "-cnv" ? "--conversation" : a == "-sys" ? "--system-prompt" : a);
  }
  if (int rc = parse_args(app, args); rc >= 0) return rc;

  ra.prompt_given = app.count("--prompt") > 0;
  if (ra.prompt_given && !ra.file.empty()) usage_fail("give the prompt with -p or -f, not both");
  if (!ra.file.empty()) {
    ra.prompt = read_prompt_file(ra.file);
    ra.prompt_given = true;
    if (ra.chat) {  // a file's last newline is not part of the message
      while (!ra.prompt.empty() && (ra.prompt.back() == '\n' || ra.prompt.back() == '\r')) ra.prompt.pop_back();
    }
  } else if (!ra.prompt_given && !ra.chat) {
    if (isatty(0)) usage_fail("give a prompt with -p TEXT, -f FILE or on stdin (roofline chat -m MODEL for a conversation)");
    ra.prompt = read_all(std::cin);
    ra.prompt_given = true;
  }
  if (!ra.chat && !ra.system_prompt.empty()) usage_fail("-sys is for a conversation: roofline chat, or run -cnv");
  if (ra.n_predict < -2) fail("-n {}: expected a count, -1 (until the end of generation) or -2 (until the context is full)", ra.n_predict);
  if (seed < -1) fail("-s {}: expected -1 (random) or a seed of 0 or more", seed);
  sp.seed = seed == -1 ? 0xFFFFFFFFu : (uint64_t)seed;
  check_sampling(sp);
  (void)engine_options(margs);  // every engine flag checked before the model loads
  if (dargs.given()) {
    check_draft_args(dargs);
    if (ra.chat) usage_fail("{}: speculative decoding is for completions (roofline run -p) and serve, not the chat loop", dargs.mtp() ? "--spec-type draft-mtp" : "-md");
  }

  auto model = load_model(margs);
  fit_context(margs, model->hparams(), 4096);
  margs.draft_rollback = dargs.given();
  margs.defer_f16_copies = dargs.given() && !ra.chat;  // the draft's engine first
  auto tokenizer = load_tokenizer(*model);
  auto engine = create_engine(model, margs);
  for (const std::string& line : engine->report()) log_info("{}", line);

  // Ctrl-C stops the reply being generated (the chat then asks for the next message).
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  if (ra.chat) return chat_loop(*engine, tokenizer, *model, margs.model, ra);
  std::unique_ptr<Drafter> draft;
  if (dargs.given()) draft = load_draft(dargs, margs, *engine);
  for (const std::string& line : engine->keep_f16_copies()) log_info("{}", line);
  return generate_once(*engine, *tokenizer, ra, draft.get());
}

int run_run(int argc, char** argv) {
  return run_guarded([](int c, char** v) { return run_body(c, v, false); }, argc, argv);
}
int run_chat(int argc, char** argv) {
  return run_guarded([](int c, char** v) { return run_body(c, v, true); }, argc, argv);
}
const CommandRegistration registration{"run", "generate text from a prompt in the terminal (-cnv: a chat)", run_run, 50};
const CommandRegistration chat_registration{"chat", "chat with a model in the terminal, through its chat template", run_chat, 51};

}  // namespace
}  // namespace roofline::cli
