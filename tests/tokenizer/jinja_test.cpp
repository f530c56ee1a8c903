// The Jinja subset one feature at a time against Jinja2 (goldens from
// scripts/goldens/gen_template_goldens.py with jinja_cases.py), and broken templates: a clear error
// with the line, never a crash.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja/template.h"
#include "tokenizer/tokenizer_test_util.h"

namespace roofline {
namespace {

TEST(Jinja, MatchesJinja2OnSmallTemplates) {
  const auto golden = nlohmann::ordered_json::parse(test::read_text_file(test::source_dir() + "/tests/tokenizer/goldens/jinja_cases.json"));
  const jinja::Value ctx = jinja::Value::from_json(golden["context"]);
  jinja::RenderOptions opt;
  opt.now = test::golden_now();
  for (const auto& c : golden["cases"]) {
    const std::string src = c["template"];
    if (c.contains("error")) {
      try {
        const std::string out = jinja::Template(src).render(ctx, opt);
        ADD_FAILURE() << "template " << src << "\nJinja2 raised " << c["error"].get<std::string>() << "\nroofline rendered: " << out;
      } catch (const Error&) {
      }
      continue;
    }
    try {
      EXPECT_EQ(jinja::Template(src).render(ctx, opt), c["output"].get<std::string>()) << "template " << src;
    } catch (const Error& e) {
      ADD_FAILURE() << "template " << src << "\n" << e.what();
    }
  }
}

TEST(Jinja, RaiseExceptionKeepsTheMessage) {
  try {
    jinja::Template("{{ raise_exception('Conversation roles must alternate') }}").render(jinja::Value(jinja::Dict{}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "Conversation roles must alternate");
  }
}

TEST(Jinja, GenerationBlockRendersItsBody) {
  EXPECT_EQ(jinja::Template("a{% generation %}b{{ 1 }}{% endgeneration %}c").render(jinja::Value(jinja::Dict{})), "ab1c");
}

TEST(TemplateErrors, MalformedTemplatesGiveClearErrors) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{% if x %}never closed", "unexpected end of template, expected 'elif' or 'else' or 'endif'"},
      {"{% for x in y %}", "expected 'else' or 'endfor'"},
      {"{{ 'unterminated }}", "unterminated string"},
      {"{{ x ", "unterminated tag"},
      {"{% endif %}", "unexpected 'endif'"},
      {"{% foo %}", "unknown or unsupported tag 'foo'"},
      {"{{ x | }}", "expected a name"},
      {"{{ (1, 2 }}", "expected ')'"},
      {"{# open comment", "unterminated comment"},
      {"{{ [1, 2 }}", "expected ','"},
      {"{% set %}", "expected a name"},
      {"line1\nline2\n{{ x ! y }}", "template line 3"},
      {"{% include 'other.jinja' %}", "unsupported tag 'include'"},
      {"{{ x }}}}{%", "unterminated tag"},
  };
  for (const auto& [src, want] : bad) {
    try {
      jinja::Template t(src);
      t.render(jinja::Value(jinja::Dict{}));
      ADD_FAILURE() << "no error for " << src;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << src << " -> " << e.what();
    }
  }
  // Runtime errors name the line, and the chat template wrapper says where the error comes from.
  try {
    ChatTemplate ct("{% for m in messages %}\n{{ m.content + 1 }}\n{% endfor %}");
    ChatTemplateInputs in;
    in.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
    ct.apply(in);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("template line 2: unsupported operand type(s) for +: 'string' and 'int'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ChatTemplate("{% if %}"), Error);
}

TEST(TemplateErrors, RecursionAndHugeOutputAreBounded) {
  EXPECT_THROW(jinja::Template("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").render(jinja::Value(jinja::Dict{})), Error);
  jinja::RenderOptions opt;
  opt.max_output = 1000;
  EXPECT_THROW(jinja::Template("{% for i in range(100000) %}xxxxxxxx{% endfor %}").render(jinja::Value(jinja::Dict{}), opt), Error);
  EXPECT_THROW(jinja::Template("{{ 'x' * 100000000000 }}").render(jinja::Value(jinja::Dict{})), Error);
}

// A template that would recurse or loop without bound fails with its reason, in bounded time and stack:
// the shapes tests/fuzz/libfuzzer/fuzz_jinja found or that follow from them (each one a stack overflow
// or an hour-long render before these bounds).
std::string render_error(const std::string& source) {
  try {
    jinja::Template(source).render(jinja::Value(jinja::Dict{}));
  } catch (const Error& e) {
    return e.what();
  }
  return "(rendered)";
}

TEST(TemplateErrors, NestingLoopsAndValueDepthAreBounded) {
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  // Parse nesting: parentheses, operator chains, filter chains, blocks in blocks.
  EXPECT_NE(render_error("{{ " + repeat("(", 5000) + "1" + repeat(")", 5000) + " }}").find("nested more than 256"), std::string::npos);
  EXPECT_NE(render_error("{{ 1" + repeat(" + 1", 100000) + " }}").find("nested more than 256"), std::string::npos);
  EXPECT_NE(render_error("{{ 'x'" + repeat("|string", 100000) + " }}").find("nested more than 256"), std::string::npos);
  EXPECT_NE(render_error(repeat("{% if true %}", 5000) + "x" + repeat("{% endif %}", 5000)).find("nested more than 256"), std::string::npos);
  // Just under the bound still renders (and its value is right).
  EXPECT_EQ(render_error("{{ " + repeat("(", 100) + "1" + repeat(" + 1)", 100) + " }}"), "(rendered)");
  EXPECT_EQ(jinja::Template("{{ " + repeat("(", 100) + "1" + repeat(" + 1)", 100) + " }}").render(jinja::Value(jinja::Dict{})), "101");
  // Loops in loops.
  EXPECT_NE(render_error("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}").find("loop iterations"),
            std::string::npos);
  // Macros calling macros, each with a nested expression: recursion at run time.
  EXPECT_NE(render_error("{% macro f(n) %}{{ " + repeat("[", 200) + "f(n + 1)" + repeat("]", 200) + " }}{% endmacro %}{{ f(0) }}")
                .find("recurses more than"),
            std::string::npos);
  // Values nested without bound through a namespace, a namespace inside itself.
  EXPECT_NE(render_error("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x|length }}")
                .find("more than 1100 levels deep"),
            std::string::npos);
  EXPECT_NE(render_error("{% set ns = namespace(x=1) %}{% set ns.x = [ns] %}{{ ns }}").find("cannot hold a namespace"), std::string::npos);
  EXPECT_NE(render_error("{% set a = namespace(x=1) %}{% set b = namespace(y=a) %}{{ b }}").find("cannot hold a namespace"), std::string::npos);
  // What a render builds: a join chain growing geometrically (fuzz_jinja: out of memory), a list doubling
  // in a loop, a huge string iterated, a centre width of a terabyte.
  EXPECT_NE(render_error("{{ ('x' * 1000)" + repeat("|join('yyyyyyyy')", 12) + " }}").find("1048576 bytes"), std::string::npos);
  EXPECT_NE(render_error("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}")
                .find("more than 1048576 items"),
            std::string::npos);
  EXPECT_NE(render_error("{{ ('x' * 60000000)|list|length }}").find("more than 1048576 bytes"), std::string::npos);
  EXPECT_NE(render_error("{{ 'x'|center(1000000000000) }}").find("center"), std::string::npos);
  // Numbers past the machine's range (fuzz_jinja: std::stod's out_of_range escaped as no Error): a float
  // literal overflows to inf as in Python, a digit attribute too large to index is an error, a float too
  // large for an int saturates instead of an undefined cast.
  EXPECT_EQ(jinja::Template("{{ 1e999 }} {{ 1e-999 }}").render(jinja::Value(jinja::Dict{})), "inf 0.0");
  EXPECT_NE(render_error("{{ [1, 2].99999999999999999999 }}").find("out of range"), std::string::npos);
  EXPECT_EQ(render_error("{{ 1e300|int }}{{ '1e300'|int }}{{ (1e999 * 0)|int }}"), "(rendered)");
  // What real templates do with namespaces still works.
  EXPECT_EQ(render_error("{% set ns = namespace(n=0, l=[]) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% set ns.l = ns.l + [i] %}"
                         "{% endfor %}{{ ns.n }}{{ ns.l }}{{ [ns]|length }}"),
            "(rendered)");
}

TEST(TemplateErrors, RandomTemplatesNeverCrash) {
  const std::string alphabet = "{}%#-+|.()[]'\" abcxyz019=<>!~,:\n";
  uint32_t seed = 99;
  auto rnd = [&]() { return seed = seed * 1664525u + 1013904223u; };
  const std::vector<std::string> seeds = {"{% for m in messages %}{{ m.role }}{% endfor %}", "{{ x | default('a') | upper }}",
                                          "{% if a %}{{ b[1:] }}{% elif c %}x{% else %}y{% endif %}",
                                          "{% set ns = namespace(a=1) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}"};
  const jinja::Value ctx = jinja::Value::from_json(nlohmann::ordered_json::parse(
      R"({"messages": [{"role": "user", "content": "hi"}], "a": 1, "b": [1, 2], "x": "s", "c": null})"));
  for (int i = 0; i < 3000; ++i) {
    std::string s = seeds[rnd() % seeds.size()];
    const int edits = 1 + rnd() % 4;
    for (int k = 0; k < edits && !s.empty(); ++k) {
      const size_t pos = rnd() % s.size();
      switch (rnd() % 3) {
        case 0: s.erase(pos, 1 + rnd() % 3); break;
        case 1: s.insert(pos, 1, alphabet[rnd() % alphabet.size()]); break;
        default: s[pos] = alphabet[rnd() % alphabet.size()];
      }
    }
    try {
      jinja::Template(s).render(ctx);
    } catch (const Error&) {
    }
  }
}

}  // namespace
}  // namespace roofline
