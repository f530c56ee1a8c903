"""Small Jinja templates (with their variables) covering the subset's syntax and built-ins one by one;
gen_template_goldens.py renders them with Jinja2 into tests/tokenizer/goldens/jinja_cases.json."""

CTX = {
    "s": "  Hello, World  ", "n": 7, "f": 2.5, "t": True, "none_v": None, "empty": "",
    "items": [3, 1, 2], "words": ["b", "a", "c"],
    "d": {"b": 2, "a": 1, "nested": {"x": [1, 2, {"y": "z"}]}},
    "msgs": [{"role": "system", "content": "sys"}, {"role": "user", "content": "u1"},
             {"role": "assistant", "content": "a1", "tool_calls": [{"function": {"name": "f", "arguments": {"k": "v", "n": 1.0}}}]},
             {"role": "user", "content": "u2"}],
    "uni": "héllo — 世界 😀 \"quoted\" back\\slash\n\ttab",
}

CASES = [
    # whitespace control: trim_blocks / lstrip_blocks / - / +
    "a\n{% if t %}\nyes\n{% endif %}\nb",
    "a\n    {% if t %}\n    yes\n    {% endif %}\nb",
    "a  {%- if t -%}  yes  {%- endif -%}  b",
    "a\n  {{ n }}\n  {{- n }}\n  {{ n -}}\n  b",
    "  {%+ if t %}x{% endif %}\n",
    "{% if t +%}\nkeep\n{% endif %}",
    "x {# comment #}\n y\n  {#- c2 -#}  z\n",
    "{% for i in items %}\n  {{ i }}\n{% endfor %}\n",
    "line1\n\t{% set x = 1 %}\nline2 {{ x }}",
    # literals and operators
    "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 8 }} {{ 7 / 2 }} {{ 6 / 3 }}",
    "{{ 'a' ~ 1 ~ none_v ~ t }} {{ 'ab' * 3 }} {{ [1] + [2, 3] }} {{ 'x' + 'y' }}",
    "{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 100.0 / 3 }} {{ f * 2 }} {{ 3.0 == 3 }} {{ true == 1 }}",
    "{{ none_v }} {{ t }} {{ not t }} {{ undefined_var }}|{{ items }} {{ d }} {{ words[0] }} {{ uni }}",
    "{{ 'it''s' }} {{ \"dq\" 'sq' }} {{ 'esc\\n\\t\\u00e9\\x41' }}",
    "{{ 1 < 2 < 3 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ 2 in items }} {{ 'ell' in s }} {{ 'z' not in words }} {{ 'a' in d }}",
    "{{ t and 'yes' or 'no' }} {{ none_v or 'dflt' }} {{ empty or 'e' }} {{ 0 and 1 }} {{ 'x' if n > 5 else 'y' }} {{ 'x' if false }}|",
    # subscripts, slices, attributes
    "{{ items[-1] }} {{ items[1:] }} {{ items[:2] }} {{ items[::-1] }} {{ words[::2] }} {{ 'hello'[1:3] }} {{ 'abc'[::-1] }} {{ items[5] }}|",
    "{{ d.a }} {{ d['b'] }} {{ d.nested.x[2].y }} {{ d.missing }}|{{ d.missing is defined }} {{ msgs[1].role }} {{ msgs[-1]['content'] }}",
    # tests
    "{{ n is defined }} {{ zz is defined }} {{ zz is not defined }} {{ none_v is none }} {{ s is string }} {{ n is number }} {{ f is float }} {{ n is integer }}",
    "{{ d is mapping }} {{ items is iterable }} {{ s is iterable }} {{ items is sequence }} {{ t is boolean }} {{ t is true }} {{ t is false }} {{ n is odd }} {{ n is even }}",
    "{{ n is divisibleby(7) }} {{ n is eq(7) }} {{ n is sameas 7 }} {{ none_v is sameas none }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ n is gt(3) }}",
    # filters
    "[{{ s | trim }}] [{{ s | upper }}] [{{ s | lower }}] [{{ 'hello world' | title }}] [{{ 'hELLO' | capitalize }}] [{{ s | length }}] [{{ items | count }}]",
    "{{ items | first }} {{ items | last }} {{ items | sort }} {{ words | sort(reverse=true) }} {{ items | reverse | list }} {{ 'abc' | reverse }} {{ items | sum }} {{ items | min }} {{ items | max }}",
    "{{ words | join(', ') }} {{ items | join }} {{ msgs | map(attribute='role') | join('/') }} {{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}",
    "{{ msgs | rejectattr('role', 'eq', 'user') | list | length }} {{ msgs | selectattr('tool_calls') | list | length }} {{ items | select('odd') | list }} {{ items | reject('odd') | list }}",
    "{{ zz | default('dflt') }} {{ empty | default('dflt') }} {{ empty | default('dflt', true) }} {{ none_v | d('x') }} {{ [1, 2, 1, 3] | unique | list }}",
    "{{ d | items | list }} {{ d | dictsort }} {% for k, v in d | items %}{{ k }}={{ v }};{% endfor %} {{ d.keys() | list }} {{ d.values() | list | length }}",
    "{{ '3' | int + 1 }} {{ 'x' | int }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 3 | float }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 7 | string ~ '!' }} {{ 'a b' | replace(' ', '_') }}",
    "{{ d | tojson }} {{ uni | tojson }} {{ msgs[2] | tojson }} {{ [] | tojson }} {{ {} | tojson }} {{ none_v | tojson }} {{ [1.5, true, 'x'] | tojson }}",
    "{{ d | tojson(indent=2) }}\n{{ msgs[2].tool_calls | tojson(indent=4) }}\n{{ {'a': []} | tojson(indent=4) }}",
    "{{ d | tojson(separators=(',', ':')) }}",
    "{{ 'line1\nline2\n\nline4' | indent(2) }}|{{ 'a\nb' | indent(4, true) }}|{{ 'x\n\ny' | indent(2, blank=true) }}",
    "{{ '<b>&\"' | e }} {{ 'a  b\tc' | wordcount }} {{ 'abc' | center(9) }}| {{ '%s=%d' | format('x', 3) }} {{ '%s-%s' % ('a', 'b') }}",
    # string methods
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\n\nhi\n'.strip('\n') }}|{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a-b-c'.split('-', 1) }}",
    "{{ s.startswith('  He') }} {{ s.endswith(('x', '  ')) }} {{ 'Hi'.upper() }} {{ 'Hi'.lower() }} {{ 'a.b'.replace('.', '::') }} {{ 'hello'.find('l') }} {{ 'hello'.count('l') }} {{ 'hello world'.title() }}",
    "{{ '<think>a</think>b'.split('</think>')[0].rstrip('\\n') }} {{ 'x<think>\\ny'.split('<think>')[-1].lstrip('\\n') }} {{ ', '.join(words) }} {{ 'abc'.capitalize() }}",
    "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 5) }} {{ items.index(2) }} {{ 'aXbX'.rsplit('X') }}",
    # loops
    "{% for i in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for i in items if i > 1 %}{{ i }}{{ loop.last }},{% else %}none{% endfor %}|{% for i in [] %}x{% else %}empty{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }} {% endfor %}{% for c in 'héy' %}[{{ c }}]{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
    "{% for i in range(3) %}{% for j in range(2) %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %} {{ range(2, 8, 3) | list }} {{ range(3, 0, -1) | list }}",
    "{% for m in msgs %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>{{ m.role }}<{{ loop.nextitem.role if loop.nextitem is defined else '-' }} {% endfor %}",
    "{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %}",
    # scoping, set, namespace, macros
    "{% set x = 0 %}{% for i in range(3) %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}",
    "{% set ns = namespace(total=0, found=false) %}{% for i in items %}{% set ns.total = ns.total + i %}{% if i == 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.total }} {{ ns.found }}",
    "{% if t %}{% set y = 'set in if' %}{% endif %}{{ y }} {% set a, b = [1, 2] %}{{ a }}{{ b }} {% set blk %}block {{ n }}{% endset %}{{ blk | upper }}",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', '?') }} {{ greet(name='Cy', punct='.') }}",
    "{% macro outer() %}[{{ caller() }}]{% endmacro %}{% call outer() %}inside {{ n }}{% endcall %} {% filter upper %}shout {{ n }}{% endfilter %}",
    "{% set ns = namespace(last=-1) %}{% for m in msgs[::-1] %}{% set idx = (msgs | length) - 1 - loop.index0 %}{% if m.role == 'user' and ns.last == -1 %}{% set ns.last = idx %}{% endif %}{% endfor %}{{ ns.last }}",
    "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d %H:%M') }}",
    # errors
    "{{ raise_exception('custom failure: ' ~ n) }}",
    "{{ undefined_obj.attr }}",
    "{{ items + 'x' }}",
    "{{ 1 / 0 }}",
    "{{ none_v.x }}",
    "{% for x in n %}{% endfor %}",
]
