/* The model's chat template (GGUF tokenizer.chat_template), rendered as Hugging Face
 * transformers' apply_chat_template renders it: jinja2 with trim_blocks and lstrip_blocks, the
 * loopcontrols extension, HF's globals raise_exception and namespace, and HF's tojson filter
 * (json.dumps with ensure_ascii=False and the default separators ", " and ": ").
 *
 * Why our own renderer: Debian packages no C Jinja library, and the chat prompt is the model's
 * input, so the router must render it exactly as the framework the model was trained with does
 * (the token ids are compared with transformers' in tests/model:chat_template_hf_test). The
 * renderer is a lexer, a parser to an AST (chat_template_parse.c) and an evaluator over json-c
 * values (chat_template_eval.c, chat_template_value.c).
 *
 * The subset (everything the Qwen3.5 template and ChatML-style templates use):
 *   statements  if/elif/else, for (tuple targets, `if` filter, else, loop.index/index0/
 *               revindex/revindex0/first/last/length/previtem/nextitem), set (names, ns.attr,
 *               block set), macro (defaults, keyword arguments), break, continue,
 *               generation (HF's block, rendered as its body), comments, `-`/`+` whitespace
 *               control;
 *   expressions literals (strings with Python escapes, ints, floats, lists, tuples, dicts,
 *               true/false/none), and/or/not, if-else, == != < > <= >=, in / not in,
 *               + - * / // % ~, unary -, attribute and subscript access, slices [a:b:c],
 *               calls of macros, namespace(), raise_exception(), dict methods items/keys/
 *               values/get and string methods startswith/endswith/split/strip/lstrip/rstrip/
 *               lower/upper/replace/title/capitalize;
 *   filters     trim, length/count, items, string, safe, tojson (indent, sort_keys), default/d,
 *               join, first, last, list, lower, upper, capitalize, title, replace, int, float,
 *               abs;
 *   tests       string, mapping, iterable, sequence, defined, undefined, none, false, true,
 *               boolean, number, integer, float, callable, odd, even.
 * Anything else (include, extends, filters or tests not listed, ...) fails at parse with
 * "line L:C: ..." naming the construct; runtime errors (a method of the wrong type, an
 * undefined value's attribute) name line:col too. raise_exception(msg) fails with msg itself.
 * Bounded: macro-call depth 64, parse nesting 256, 10^6 loop iterations per render, 64 MiB of
 * output (and of any one string), 256 MiB of strings made in all. Templates render as Python would print values: str() of ints, floats (repr), True/
 * False/None, lists and dicts (repr); autoescape is off, so `safe` is the identity. Limits:
 * lower/upper/title/capitalize map ASCII letters only; loop has no cycle() or changed().
 *
 * A chat_template is immutable after parse: render from any number of threads at once. */
#ifndef DS_MODEL_CHAT_TEMPLATE_H
#define DS_MODEL_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

struct json_object;

typedef struct chat_template chat_template;

/* Parses src[0..len). 0 on success (*out owned by the caller); -1 with err naming line:col
 * and the construct (a malformed or unsupported template); never crashes. */
int chat_template_parse(const char *src, size_t len, chat_template **out, char *err,
                        size_t errlen);
void chat_template_free(chat_template *t);

/* Renders with variables from `vars` (a json-c object: messages, tools,
 * add_generation_prompt, enable_thinking, bos_token, eos_token, ...; a key absent is
 * undefined). 0 with *out malloc'd and NUL-terminated (*len excludes the NUL; the text may
 * hold NULs carried in from the variables); -1 with err (raise_exception's message, or
 * "line L:C: ..."). `vars` is not modified. */
int chat_template_render(const chat_template *t, struct json_object *vars, char **out,
                         size_t *len, char *err, size_t errlen);

/* OpenAI-shaped conversation -> prompt text. messages: array of {role, content (string, null
 * or array of {type:"text", text}), reasoning_content?, tool_calls? [{id, type, function:
 * {name, arguments (JSON text or object)}}], tool_call_id?, name?}; tools: array of OpenAI
 * {type:"function", function:{name, description, parameters}} or NULL; thinking -1 = the
 * template's default (enable_thinking undefined), 0 = false, 1 = true. Normalises as vLLM
 * does before HF's renderer: a tool call's arguments given as JSON text are parsed to an
 * object (text that is not a JSON object is an error naming the message). *in_reasoning: the
 * rendered prompt ends inside an open <think> block (the model's output starts as
 * reasoning). Errors as chat_template_render, plus "messages[i].field: ..." for a malformed
 * message. */
int chat_template_render_chat(const chat_template *t, struct json_object *messages,
                              struct json_object *tools, int thinking,
                              bool add_generation_prompt, char **out, size_t *len,
                              bool *in_reasoning, char *err, size_t errlen);

/* Whether the template thinks by default: a one-user-turn conversation with the generation
 * prompt renders the same with enable_thinking undefined as with true, and differently with
 * false (a template with no thinking switch does not think by default). */
bool chat_template_thinking_default(const chat_template *t);

#endif
